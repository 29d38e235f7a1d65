"""Keep each task attempt's output with its run; show it live only when asked to.

Two modes, chosen by ``UF_VERBOSE`` (``michelangelo --verbose`` sets it):

- quiet (the default): file descriptors 1 and 2 point at the attempt's log file while the
  attempt runs, so everything written by the process lands there: the task's prints, Ray's
  log monitor (worker prints, Train and Data progress, raylet warnings), native code. The
  console keeps a private copy of the original stderr (:func:`console_stream`), which the
  reporters write to. Python warnings are written to the log too; those that point at the
  user's code or this SDK also reach the console, once each.
- verbose: the output is copied to the log and still printed, as it happens.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import sys
import sysconfig
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import IO

_LOCK = threading.Lock()
_CONSOLE: IO[str] | None = None  # the terminal while output is redirected
_DEPTH = 0
_THIRD_PARTY = tuple(
    p for p in {sysconfig.get_paths().get("purelib"), sysconfig.get_paths().get("platlib")} if p
)


def verbose() -> bool:
    """Whether task output streams to the console (``UF_VERBOSE=1``)."""
    return os.environ.get("UF_VERBOSE", "").strip().lower() in ("1", "true", "yes", "on")


def console_stream() -> IO[str]:
    """The stream that reaches the person running the workflow, redirected or not."""
    return _CONSOLE or sys.__stderr__ or sys.stderr


class ConsoleFile:
    """A file-like object that always writes to :func:`console_stream` (for rich)."""

    def write(self, text: str) -> int:
        return console_stream().write(text)

    def flush(self) -> None:
        console_stream().flush()

    def isatty(self) -> bool:
        return bool(getattr(console_stream(), "isatty", lambda: False)())

    def fileno(self) -> int:
        return console_stream().fileno()

    @property
    def encoding(self) -> str:
        return getattr(console_stream(), "encoding", "utf-8") or "utf-8"


class _Tee:
    """A text stream that writes to the original stream and to a log file."""

    def __init__(self, original: IO[str], log: IO[str], lock: threading.Lock) -> None:
        self._original = original
        self._log = log
        self._lock = lock

    def write(self, text: str) -> int:
        with self._lock:
            if not self._log.closed:
                self._log.write(text)
        return self._original.write(text)

    def flush(self) -> None:
        with self._lock:
            if not self._log.closed:
                self._log.flush()
        self._original.flush()

    def __getattr__(self, name: str):
        return getattr(self._original, name)


def important_warning(filename: str) -> bool:
    """A warning that points at user code or this SDK, not inside a third-party package."""
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = os.path.abspath(filename or "")
    if path.startswith(here + os.sep):
        return True
    return not any(path.startswith(root + os.sep) for root in _THIRD_PARTY)


@contextlib.contextmanager
def capture_output(
    path: str | None,
    *,
    quiet: bool | None = None,
    on_warning: Callable[[str], None] | None = None,
) -> Iterator[None]:
    """Send everything printed while the block runs into ``path``.

    Args:
        path: Local log file (appended to). ``None`` captures nothing.
        quiet: Keep the output off the console; defaults to ``not verbose()``.
        on_warning: Receives the text of each important Python warning in quiet mode.
    """
    if path is None:
        yield
        return
    if quiet is None:
        quiet = not verbose()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    if quiet:
        with _redirect(path, on_warning):
            yield
        return
    lock = threading.Lock()
    # Ray's driver-side log monitor prints worker output through sys.stdout/sys.stderr, so
    # worker lines land in the same file as the task's own prints.
    with open(path, "a", buffering=1, encoding="utf-8") as log:
        out, err = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = _Tee(out, log, lock), _Tee(err, log, lock)
        try:
            yield
        finally:
            sys.stdout, sys.stderr = out, err


@contextlib.contextmanager
def _redirect(path: str, on_warning: Callable[[str], None] | None) -> Iterator[None]:
    global _CONSOLE, _DEPTH
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    log = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 - closed below
    saved = {}
    with _LOCK:
        if _CONSOLE is None:
            _CONSOLE = _open_console()
        _DEPTH += 1
        for fd in (1, 2):
            with contextlib.suppress(OSError):
                saved[fd] = os.dup(fd)
                os.dup2(log.fileno(), fd)
    out, err = sys.stdout, sys.stderr
    # Python-level streams too (a test runner may have replaced them with non-fd objects).
    # They write to the descriptors rather than to the log file, so a handler that keeps
    # them past the attempt (a logger set up inside the task) writes wherever the
    # descriptor points next instead of to a closed file.
    sys.stdout, sys.stderr = _FdStream(1), _FdStream(2)
    previous_show = warnings.showwarning
    seen: set[str] = set()

    def show(message, category, filename, lineno, file=None, line=None):
        text = warnings.formatwarning(message, category, filename, lineno, line)
        with contextlib.suppress(Exception):
            log.write(text)
        if on_warning is not None and important_warning(filename):
            short = f"{category.__name__}: {message}"
            if short not in seen:
                seen.add(short)
                on_warning(short)

    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = previous_show
        sys.stdout, sys.stderr = out, err
        with contextlib.suppress(Exception):
            log.flush()
        with _LOCK:
            for fd, copy in saved.items():
                with contextlib.suppress(OSError):
                    os.dup2(copy, fd)
                os.close(copy)
            _DEPTH -= 1
            if _DEPTH == 0 and _CONSOLE is not None:
                with contextlib.suppress(Exception):
                    _CONSOLE.flush()
                    _CONSOLE.close()
                _CONSOLE = None
        log.close()


_THREAD_LOG: contextvars.ContextVar[tuple[IO[str], bool] | None] = contextvars.ContextVar(
    "uniflow_thread_log", default=None
)
_ROUTED = 0  # captures that need the routers below in place
_ROUTED_FROM: tuple[IO[str], IO[str]] | None = None


class _ThreadRouter:
    """``sys.stdout``/``sys.stderr`` while concurrent branches run: each thread's writes go
    to the log of the attempt it runs (and on to the console when not quiet); other threads'
    writes go where they went before."""

    def __init__(self, fallback: IO[str]) -> None:
        self._fallback = fallback

    def write(self, text: str) -> int:
        target = _THREAD_LOG.get()
        if target is None:
            return self._fallback.write(text)
        log, tee = target
        with contextlib.suppress(ValueError):  # closed by an attempt that just ended
            log.write(text)
        if tee:
            self._fallback.write(text)
        return len(text)

    def flush(self) -> None:
        target = _THREAD_LOG.get()
        if target is not None:
            with contextlib.suppress(ValueError):
                target[0].flush()
        self._fallback.flush()

    def __getattr__(self, name: str):
        return getattr(self._fallback, name)


@contextlib.contextmanager
def capture_thread_output(
    path: str | None,
    *,
    quiet: bool | None = None,
    on_warning: Callable[[str], None] | None = None,
) -> Iterator[None]:
    """Like :func:`capture_output`, for one thread among several that run at once.

    File descriptors are shared by every thread, so only what Python code of this thread
    prints lands in ``path``; output of native code and of Ray's log monitor goes to the run's
    driver log (or the console), as between tasks. ``on_warning`` is accepted for symmetry:
    warnings keep the handler of the surrounding run.
    """
    global _ROUTED, _ROUTED_FROM
    if path is None:
        yield
        return
    if quiet is None:
        quiet = not verbose()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    log = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 - closed below
    with _LOCK:
        if _ROUTED == 0:
            _ROUTED_FROM = (sys.stdout, sys.stderr)
            sys.stdout, sys.stderr = _ThreadRouter(sys.stdout), _ThreadRouter(sys.stderr)
        _ROUTED += 1
    token = _THREAD_LOG.set((log, not quiet))
    try:
        yield
    finally:
        _THREAD_LOG.reset(token)
        with _LOCK:
            _ROUTED -= 1
            if _ROUTED == 0 and _ROUTED_FROM is not None:
                sys.stdout, sys.stderr = _ROUTED_FROM
                _ROUTED_FROM = None
        log.close()


def _open_console() -> IO[str] | None:
    """A private handle on the current stderr that the redirection leaves alone."""
    try:
        fd = os.dup(2)
    except OSError:
        return None
    stream = os.fdopen(fd, "w", buffering=1, encoding="utf-8", errors="replace")
    return _TtyAware(stream, _isatty(sys.__stderr__))


def _isatty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except Exception:  # noqa: BLE001 - closed or odd stream
        return False


class _FdStream:
    """A text stream over a file descriptor, unbuffered, never closed by us."""

    encoding = "utf-8"
    errors = "replace"

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def write(self, text: str) -> int:
        data = text.encode("utf-8", "replace")
        with contextlib.suppress(OSError):
            while data:
                data = data[os.write(self._fd, data):]
        return len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        return None

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return self._fd

    def writable(self) -> bool:
        return True

    @property
    def closed(self) -> bool:
        return False


class _TtyAware:
    """The console copy reports whether the original stderr was a terminal."""

    def __init__(self, stream: IO[str], tty: bool) -> None:
        self._stream = stream
        self._tty = tty

    def isatty(self) -> bool:
        return self._tty

    def __getattr__(self, name: str):
        return getattr(self._stream, name)
