"""The sandbox's one exception type."""

from __future__ import annotations


class SandboxError(RuntimeError):
    """A sandbox step could not be done; the message names the command and the fix."""
