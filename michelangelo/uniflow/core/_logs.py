"""Keep each task attempt's output with its run while still showing it live."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator
from typing import IO


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


@contextlib.contextmanager
def capture_output(path: str | None) -> Iterator[None]:
    """Copy everything printed to stdout/stderr (Ray worker output included) into ``path``.

    Ray's driver-side log monitor prints worker output through ``sys.stdout``/``sys.stderr``,
    so worker lines land in the same file as the task's own prints.
    """
    if path is None:
        yield
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    lock = threading.Lock()
    with open(path, "a", buffering=1, encoding="utf-8") as log:
        out, err = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = _Tee(out, log, lock), _Tee(err, log, lock)
        try:
            yield
        finally:
            sys.stdout, sys.stderr = out, err
