"""uniflow's exceptions: one root, user errors apart from system errors."""

from __future__ import annotations

from michelangelo.errors import InputError, MichelangeloError, ServiceError


class UniflowError(MichelangeloError):
    """Root of every error uniflow raises itself (a ``MichelangeloError``)."""


class UserError(UniflowError, InputError, ValueError):
    """Something the user asked for cannot work; the message says how to fix it."""


class TaskTimeoutError(UniflowError, ServiceError, TimeoutError):
    """A task ran longer than its ``timeout``."""


class RunNotFoundError(UserError):
    """A run id that storage does not know."""


class ClusterError(UniflowError, ServiceError):
    """A cluster could not be started, reached or kept alive."""


class RemoteTaskError(UniflowError):
    """A task that ran elsewhere failed in a way that has no better type on this side."""
