"""uniflow's exceptions: one root, user errors apart from system errors."""

from __future__ import annotations


class UniflowError(Exception):
    """Root of every error uniflow raises itself."""

    def __reduce__(self):  # keep the type across Ray process boundaries
        return (type(self), self.args)


class UserError(UniflowError, ValueError):
    """Something the user asked for cannot work; the message says how to fix it."""


class TaskTimeoutError(UniflowError, TimeoutError):
    """A task ran longer than its ``timeout``."""


class RunNotFoundError(UserError):
    """A run id that storage does not know."""


class ClusterError(UniflowError):
    """A cluster could not be started, reached or kept alive."""


class RemoteTaskError(UniflowError):
    """A task that ran elsewhere failed in a way that has no better type on this side."""
