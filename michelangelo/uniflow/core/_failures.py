"""Error shaping: a failure as the run records it, and as the caller of a run receives it."""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Callable

from michelangelo.uniflow.core._console import Reporter


def error_dict(exc: BaseException) -> dict:
    """``exc`` as a task or run record keeps it (type, message, traceback, plugin detail)."""
    error = {
        "type": type(exc).__name__,
        "message": str(exc)[:2000],
        "traceback": "".join(traceback.format_exception(exc))[-8000:],
    }
    # A plugin that knows more (which worker failed, its last log lines) attaches it here.
    detail = getattr(exc, "uniflow_failure_detail", None)
    if isinstance(detail, dict):
        error["detail"] = detail
    return error


def raiser(exc: BaseException) -> Callable[[], None]:
    """A function that raises ``exc`` again (a cleanup that reports an earlier failure)."""
    def again() -> None:
        raise exc

    return again


def summarized(exc: BaseException, reporter: Reporter) -> BaseException:
    """Mark ``exc`` as already shown to the user by a quiet console's failure summary."""
    if reporter.quiet:
        with contextlib.suppress(AttributeError, TypeError):
            exc.__uniflow_summarized__ = True
    return exc


def task_failed(exc: BaseException, task_name: str) -> BaseException:
    """The user's own exception, its message prefixed with the task name."""
    return prefixed(exc, f"task {task_name!r} failed: ")


def prefixed(exc: BaseException, prefix: str) -> BaseException:
    """``exc`` itself (its type unchanged), its message starting with ``prefix``."""
    args = exc.args
    if args and isinstance(args[0], str):
        if not args[0].startswith(prefix):
            exc.args = (prefix + args[0], *args[1:])
    elif not args:
        exc.args = (prefix.rstrip(": "),)
    else:
        exc.add_note(prefix.rstrip(": "))
    return exc
