"""The trainer's own error: a run whose ranks stopped stepping together."""

from __future__ import annotations

from michelangelo.errors import InputError

__all__ = ["TrainingStalledError"]


class TrainingStalledError(InputError, RuntimeError):
    """The workers' fit made no progress for ``stall_timeout_s``: the ranks stopped stepping
    together. The message lists each rank's blocked line and stack; the same code stalls the
    same way again, so it is an :class:`~michelangelo.errors.InputError` (and a
    ``RuntimeError``, like the process group's own timeout it replaces)."""
