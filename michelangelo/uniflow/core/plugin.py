"""What plugins and tools build on: the run, the remote call, storage and the run store.

``michelangelo.uniflow.core`` is the face for workflow authors; this module is the face for
code that extends uniflow (the Ray plugin, KubeRay) or reads its records (the CLI, the report,
the model registry). Everything here is re-exported from the private modules that own it, so
other packages never import ``michelangelo.uniflow.core._*``. Errors live in
:mod:`michelangelo.uniflow.core.errors`.

Libraries that make task calls of their own (``michelangelo.uniflow.core.lib.concurrent``)
also find here the plugin lookup, call numbering scopes and future resolution they need.

Typical use::

    from michelangelo.uniflow.core.plugin import Run, Storage, TaskPlugin, register_plugin
"""

from michelangelo.uniflow.core._context import RunOption, register_run_option
from michelangelo.uniflow.core._failures import prefixed
from michelangelo.uniflow.core._io import ValueIO, register_io
from michelangelo.uniflow.core._plugin import TaskPlugin, find_plugin, register_plugin
from michelangelo.uniflow.core._records import (
    RunRecord,
    RunState,
    RunStore,
    TaskRecord,
    TaskState,
)
from michelangelo.uniflow.core._remote import RemoteCall, read_remote_artifacts
from michelangelo.uniflow.core._remote_attempt import execute_remote_call
from michelangelo.uniflow.core._run import Run, record_artifact
from michelangelo.uniflow.core._runtime import active_run, call_scope, current_call
from michelangelo.uniflow.core._storage import ENV_STORAGE_URL, Storage, storage_url
from michelangelo.uniflow.core._timeout import interrupt_thread, wait_awake
from michelangelo.uniflow.core._values import resolve_futures

__all__ = [
    "ENV_STORAGE_URL",
    "RemoteCall",
    "Run",
    "RunOption",
    "RunRecord",
    "RunState",
    "RunStore",
    "Storage",
    "TaskPlugin",
    "TaskRecord",
    "TaskState",
    "ValueIO",
    "active_run",
    "call_scope",
    "current_call",
    "execute_remote_call",
    "find_plugin",
    "interrupt_thread",
    "prefixed",
    "read_remote_artifacts",
    "record_artifact",
    "register_io",
    "register_plugin",
    "register_run_option",
    "resolve_futures",
    "wait_awake",
    "storage_url",
]
