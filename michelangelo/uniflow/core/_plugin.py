"""Task plugins: a task's ``config`` object finds its executor by type.

The core knows only "a config with hooks". A plugin validates its config when a task is
declared, may refuse a body that cannot work where it is about to run, and wraps each
execution of the task body in a context manager (for the Ray
plugin: provision or reuse a cluster, then connect to it). A plugin may also run attempts
somewhere else (the Ray plugin's remote-run: a Ray job per attempt) from a JSON description.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from michelangelo.uniflow.core._remote import RemoteCall
from michelangelo.uniflow.core.errors import UserError

# A hook's ``run`` is the ``Run`` the task call belongs to (``uniflow.core.plugin.Run``),
# typed Any here: the run calls its tasks' plugins, so this module sits below the run's.
Run = Any


class TaskPlugin:
    """Base class of plugins; the default runs the body in the driver process as it is."""

    def validate(self, config: Any) -> None:
        """Raise ``ValueError`` for a config that cannot work, before anything starts."""

    def check_body(self, config: Any, fn: Any) -> None:
        """Raise for a task body that cannot work in this process, before an attempt starts.

        Called in the process that runs the body (the driver, or the other side of
        :meth:`run_elsewhere`), before :meth:`execution` starts anything for the attempt.
        """

    @contextlib.contextmanager
    def execution(self, config: Any, run: Run) -> Iterator[None]:
        """Surround one attempt of a task body (and the persisting of its result)."""
        yield

    def describe(self, config: Any) -> str:
        return "local"

    def runs_elsewhere(self, config: Any, run: Run) -> bool:
        """Whether this run sends the task's attempts to :meth:`run_elsewhere`."""
        return False

    def plan_concurrency(self, configs: list[Any], run: Run) -> tuple[int | None, str]:
        """How many of these concurrent branches (one config each) may run at once, and why.

        Called once when a batch starts, before any branch runs, with the configs of the
        batch's branches that this plugin executes. Returns ``(limit, reason)``: ``None``
        sets no limit; ``reason`` is one short clause for the batch's placement line.
        A plugin whose branches share something finite (a cluster) also keeps them from
        oversubscribing it while they run.
        """
        return None, ""

    def run_elsewhere(self, config: Any, run: Run, call: RemoteCall) -> None:
        """Run one attempt described by ``call`` somewhere else and wait for it to end.

        The other side runs ``uniflow``'s ``execute_remote_call(call)``, which writes the
        result (or the error) where the driver reads it. Called inside :meth:`execution`.
        """
        raise NotImplementedError(f"{type(self).__name__} runs every task in this process")


_PLUGINS: dict[type, TaskPlugin] = {}
_LOCAL = TaskPlugin()


def register_plugin(config_type: type, plugin: TaskPlugin) -> None:
    """Make ``plugin`` the executor of tasks whose config is a ``config_type``."""
    _PLUGINS[config_type] = plugin


def any_plugin_runs_elsewhere() -> bool:
    """Whether some registered plugin can run task bodies outside this process."""
    return any(type(p).runs_elsewhere is not TaskPlugin.runs_elsewhere for p in _PLUGINS.values())


def find_plugin(config: Any) -> TaskPlugin:
    """The plugin registered for ``config``'s type (or a base of it); the local one for None.

    Raises:
        UserError: No plugin handles that type of config.
    """
    if config is None:
        return _LOCAL
    for klass in type(config).__mro__:
        if klass in _PLUGINS:
            return _PLUGINS[klass]
    raise UserError(
        f"@uniflow.task(config={config!r}): no uniflow plugin handles "
        f"{type(config).__name__} configs. Import the plugin that defines it (for Ray: "
        "`from michelangelo.uniflow.plugins.ray import RayTask`) or pass config=None to run "
        "the task in the local process."
    )
