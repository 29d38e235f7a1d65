"""What is running now: the run and task call a piece of code executes inside.

Three context variables, each with its accessors: the active run (:func:`active_run`), the
task call whose body runs (:func:`current_call`) and the scope that numbers task calls
(:func:`call_scope`). The run and its tasks set them; everything else only reads them, so
this module sits below the run, the tasks and the remote side.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from michelangelo.uniflow.core._storage import Storage


@dataclass(frozen=True)
class CallInfo:
    """The task call whose body is running."""

    run_id: str
    call_id: str
    task_name: str
    attempt: int
    storage: Storage
    call_dir: str  # filesystem path of this call's folder in storage
    # Where ``record_artifact`` entries go when no run is active here (a remote attempt):
    # they travel back to the driver in the result file.
    artifacts: list[dict] | None = None

    @property
    def scratch_url(self) -> str:
        """URL of a folder that belongs to this call (Ray Train results, datasets)."""
        return self.storage.url_of(self.call_dir)


_CURRENT: contextvars.ContextVar[CallInfo | None] = contextvars.ContextVar(
    "uniflow_current_call", default=None
)


def current_call() -> CallInfo | None:
    """The task call running on this thread, or None outside any task."""
    return _CURRENT.get()


def set_current_call(info: CallInfo | None) -> contextvars.Token:
    return _CURRENT.set(info)


def reset_current_call(token: contextvars.Token) -> None:
    _CURRENT.reset(token)


# The active run is typed Any here: this module sits below the run's own module
# (michelangelo.uniflow.core.plugin.Run), which sets it.
_ACTIVE_RUN: contextvars.ContextVar[Any] = contextvars.ContextVar(
    "uniflow_active_run", default=None
)


def active_run() -> Any:
    """The run (a ``Run``) whose workflow body executes here, or None outside any run."""
    return _ACTIVE_RUN.get()


def set_active_run(run: Any) -> contextvars.Token:
    return _ACTIVE_RUN.set(run)


def reset_active_run(token: contextvars.Token) -> None:
    _ACTIVE_RUN.reset(token)


@contextlib.contextmanager
def no_run() -> Iterator[None]:
    token = _ACTIVE_RUN.set(None)
    try:
        yield
    finally:
        _ACTIVE_RUN.reset(token)


class CallScope:
    """Numbers the task calls made in one thread of control (the workflow, or one branch).

    The workflow body numbers its calls ``001-``, ``002-``, ...; a concurrent branch numbers
    the calls it makes itself under its own prefix (``003-train[1].001-``), so that every id
    depends only on call order within its branch, never on how branches interleave.
    """

    def __init__(self, prefix: str = "") -> None:
        self.prefix = prefix
        self._count = 0
        self._lock = threading.Lock()

    def next(self) -> int:
        with self._lock:
            self._count += 1
            return self._count


_SCOPE: contextvars.ContextVar[CallScope | None] = contextvars.ContextVar(
    "uniflow_call_scope", default=None
)


@contextlib.contextmanager
def call_scope(prefix: str) -> Iterator[None]:
    """Number the task calls made inside the block under ``prefix``."""
    token = _SCOPE.set(CallScope(prefix))
    try:
        yield
    finally:
        _SCOPE.reset(token)


def current_scope() -> CallScope | None:
    """The scope set by the innermost :func:`call_scope` here, or None (the run's own)."""
    return _SCOPE.get()
