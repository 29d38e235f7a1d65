"""The SDK's one exception root, with user errors apart from system errors.

Every error the SDK raises on purpose is a :class:`MichelangeloError`, so one ``except``
catches them all. Two branches say whose move it is:

- :class:`InputError`: what was asked cannot work (a field, a value, a shape, a name); the
  message names it and the fix. Trying the same thing again fails the same way.
- :class:`ServiceError`: something the SDK relies on failed (a Ray cluster, the Kubernetes
  API server, the sandbox's tools, stored weights). Trying again later may work.

Every :class:`InputError` is also a ``ValueError`` (the guide's bad-input errors; a value of
the wrong kind is an :class:`InputTypeError`, a ``TypeError`` too), every :class:`ServiceError`
a ``RuntimeError``, and the existing types keep their own bases as well, so code that caught
those goes on working. :class:`InternalError` is the SDK's own bug, never the user's.
"""

from __future__ import annotations

__all__ = ["InputError", "InputTypeError", "InternalError", "MichelangeloError", "ServiceError"]


class MichelangeloError(Exception):
    """Root of every error the SDK raises on purpose."""

    def __reduce__(self):  # keep the type across Ray process boundaries
        return (type(self), self.args)


class InputError(MichelangeloError, ValueError):
    """What was asked cannot work; the message names the field, the value and the fix.

    It is a ``ValueError`` too, so the ``ValueError`` the guide documents for bad input holds.
    """


class InputTypeError(InputError, TypeError):
    """A value of the wrong kind (a list where a Dataset goes, a non-callable where a function
    goes); a ``TypeError`` as Python's own calls raise, and an :class:`InputError`."""


class ServiceError(MichelangeloError, RuntimeError):
    """Something the SDK relies on failed; the message says what, and what was tried.

    A ``RuntimeError`` too, as the failures of the services it stands for have always been.
    """


class InternalError(MichelangeloError, RuntimeError):
    """One of the SDK's own invariants broke: a bug in the SDK, whatever the input; the
    message says so and asks for a report."""
