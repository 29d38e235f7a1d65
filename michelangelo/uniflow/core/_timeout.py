"""Per-task time limits."""

from __future__ import annotations

import contextlib
import signal
import threading
import warnings
from collections.abc import Iterator

from michelangelo.uniflow.core.errors import TaskTimeoutError


@contextlib.contextmanager
def time_limit(seconds: float | None, task_name: str) -> Iterator[None]:
    """Raise :class:`TaskTimeoutError` in the body when it runs past ``seconds``.

    Uses a real-time interval timer, so it interrupts Python code (and blocking Ray calls,
    which check for signals) in the main thread. Elsewhere the limit cannot be enforced and a
    warning says so.
    """
    if not seconds:
        yield
        return
    if threading.current_thread() is not threading.main_thread():
        warnings.warn(
            f"task {task_name!r}: timeout={seconds} is only enforced when the workflow runs in "
            "the main thread; running without a time limit.",
            stacklevel=3,
        )
        yield
        return

    def _expire(signum, frame):
        raise TaskTimeoutError(
            f"task {task_name!r} exceeded its timeout of {seconds:g}s. Raise "
            f"@uniflow.task(timeout=...) or make the task faster."
        )

    previous = signal.signal(signal.SIGALRM, _expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
