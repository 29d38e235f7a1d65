"""Per-task time limits."""

from __future__ import annotations

import contextlib
import ctypes
import signal
import threading
import time
from collections.abc import Callable, Iterator

from michelangelo.uniflow.core.errors import TaskTimeoutError


@contextlib.contextmanager
def time_limit(seconds: float | None, task_name: str) -> Iterator[None]:
    """Raise :class:`TaskTimeoutError` in the body when it runs past ``seconds``.

    In the main thread a real-time interval timer interrupts Python code (and blocking Ray
    calls, which check for signals). In another thread (a concurrent branch) a timer raises
    the error in that thread as soon as it runs Python code again: a call blocked in native
    code (a sleep, ``ray.get``) ends first.
    """
    if not seconds:
        yield
        return
    message = (f"task {task_name!r} exceeded its timeout of {seconds:g}s. Raise "
               f"@uniflow.task(timeout=...) or make the task faster.")
    if threading.current_thread() is not threading.main_thread():
        with _thread_time_limit(seconds, message):
            yield
        return

    def _expire(signum, frame):
        raise TaskTimeoutError(message)

    previous = signal.signal(signal.SIGALRM, _expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def interrupt_thread(thread_id: int, error: type[BaseException]) -> bool:
    """Raise ``error`` in another thread when it next runs Python code."""
    done = ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id),
                                                      ctypes.py_object(error))
    return done == 1


# An error raised in a thread (a task's timeout, the KeyboardInterrupt that stopping a run sends
# each branch) only fires once that thread runs Python again, and so does a Ctrl-C that the
# kernel handed to another thread of the process. A wait that must end on either wakes this often.
WAKE_S = 0.25


def wait_awake(wait: Callable[[float], bool], timeout: float | None = None) -> bool:
    """Call ``wait`` (an Event's or a Condition's ``wait``) in slices of :data:`WAKE_S`.

    Returns True as soon as one slice does (set, or notified), False once ``timeout`` passes;
    with no timeout it waits until then, however long, while staying interruptible.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        left = WAKE_S if deadline is None else min(WAKE_S, deadline - time.monotonic())
        if left <= 0:
            return False
        if wait(left):
            return True


@contextlib.contextmanager
def _thread_time_limit(seconds: float, message: str) -> Iterator[None]:
    # The error is raised by class (the interpreter instantiates it without arguments), so
    # the message travels on a subclass that still reads as TaskTimeoutError.
    expired = type("TaskTimeoutError", (TaskTimeoutError,),
                   {"__init__": lambda self, *a: TaskTimeoutError.__init__(self, message),
                    "__module__": TaskTimeoutError.__module__,
                    "__reduce__": lambda self: (TaskTimeoutError, (message,))})
    lock = threading.Lock()
    state = {"armed": True}
    thread_id = threading.get_ident()

    def expire() -> None:
        with lock:
            if state["armed"]:
                interrupt_thread(thread_id, expired)

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        with lock:
            state["armed"] = False
        timer.cancel()
