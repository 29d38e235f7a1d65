"""The sandbox's one exception type."""

from __future__ import annotations

from michelangelo.errors import ServiceError


class SandboxError(ServiceError, RuntimeError):
    """A sandbox step could not be done; the message names the command and the fix."""
