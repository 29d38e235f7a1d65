"""Adopt the orphans of a local cluster's teardown, so that this process reaps them itself.

When a node is killed, its processes lose their parent and Linux hands them to the nearest
ancestor that is a "child subreaper", or else to PID 1. PID 1 (an init system, a container's
entry point) reaps them when it gets to it, which can take a second or more, and until then
each is a defunct entry in ``ps``. Teardown waits until every killed process is reaped, so
that no Ray process is left, not even a defunct one; with this process as their subreaper it
reaps them as soon as they exit instead of waiting for PID 1.

Only for the length of the teardown: afterwards the flag is back to what it was, and a process
orphaned later goes to PID 1 as before. Elsewhere than Linux this does nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import sys
from collections.abc import Iterator
from typing import Any

_PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>
_PR_GET_CHILD_SUBREAPER = 37


def _prctl() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def is_subreaper() -> bool:
    """Whether this process is a child subreaper now (False where that does not exist)."""
    prctl = _prctl()
    if prctl is None:
        return False
    flag = ctypes.c_int(0)
    if prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0) != 0:
        return False
    return bool(flag.value)


@contextlib.contextmanager
def adopting_orphans() -> Iterator[None]:
    """Within the block, this process adopts the orphans of its descendants."""
    prctl = _prctl()
    was = is_subreaper()
    if prctl is None or was or prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        yield  # not available, refused, or already set by someone else: leave it as it is
        return
    try:
        yield
    finally:
        prctl(_PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
