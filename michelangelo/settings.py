"""Settings the SDK reads from environment variables, each kind parsed one way.

A bad value fails with a message that names the variable, the value and the fix.
"""

from __future__ import annotations

import os

__all__ = ["byte_count"]


def byte_count(name: str, *, fix: str) -> int | None:
    """The number of bytes in the environment variable ``name``; None when unset or blank.

    Accepts a whole number or a float such as ``2e9``.

    Raises:
        ValueError: The value is not a number at least 0; the message ends with ``fix``.
    """
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return None
    try:
        value = int(float(raw))
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(f"{name}={raw!r} is not a byte count. Fix: {fix}")
    return value
