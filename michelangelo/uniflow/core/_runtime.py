"""What is running now: the run and task call a piece of code executes inside."""

from __future__ import annotations

import contextvars
from dataclasses import dataclass
from typing import TYPE_CHECKING

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
