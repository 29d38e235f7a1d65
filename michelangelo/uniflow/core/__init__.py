"""uniflow: tasks and workflows whose results persist to any fsspec storage.

Typical use::

    import michelangelo.uniflow.core as uniflow

    @uniflow.task()
    def add(a: int, b: int) -> int:
        return a + b

    @uniflow.workflow()
    def pipeline(n: int) -> int:
        return add(n, add(n, 1))

    if __name__ == "__main__":
        print(uniflow.create_context().run(pipeline, 2))
"""

from michelangelo.uniflow.core._console import PlainReporter, Reporter
from michelangelo.uniflow.core._context import (
    Context,
    RunOption,
    create_context,
    register_run_option,
)
from michelangelo.uniflow.core._io import ValueIO, register_io
from michelangelo.uniflow.core._logs import capture_output, console_stream
from michelangelo.uniflow.core._plugin import TaskPlugin, register_plugin
from michelangelo.uniflow.core._records import RunState, TaskState
from michelangelo.uniflow.core._run import record_artifact
from michelangelo.uniflow.core._runtime import current_call
from michelangelo.uniflow.core._task import Task, task
from michelangelo.uniflow.core._usage import (
    Usage,
    record_phases,
    record_resources,
    task_phases,
    task_usage,
    time_and_resources,
    usage_line,
)
from michelangelo.uniflow.core._workflow import Workflow, workflow
from michelangelo.uniflow.core.errors import (
    RemoteTaskError,
    RunNotFoundError,
    TaskTimeoutError,
    UniflowError,
    UserError,
)

__all__ = [
    "Context",
    "PlainReporter",
    "RemoteTaskError",
    "Reporter",
    "RunNotFoundError",
    "RunOption",
    "RunState",
    "Task",
    "TaskPlugin",
    "TaskState",
    "TaskTimeoutError",
    "UniflowError",
    "Usage",
    "UserError",
    "ValueIO",
    "Workflow",
    "capture_output",
    "console_stream",
    "create_context",
    "current_call",
    "record_artifact",
    "record_phases",
    "record_resources",
    "register_io",
    "register_plugin",
    "register_run_option",
    "task",
    "task_phases",
    "task_usage",
    "time_and_resources",
    "usage_line",
    "workflow",
]
