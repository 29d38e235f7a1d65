"""One HTTP error scheme for every serving path: a status, a reason, ``{"error": reason}``.

Handlers raise :class:`HTTPError` subclasses; the endpoint turns them into a JSON body with
that status. Anything else escaping a handler is a bug of ours, never of the caller, and is
still answered (see ``_app``) rather than allowed to take the replica down.
"""

from __future__ import annotations

from typing import Any

from michelangelo.errors import InputError, MichelangeloError


class ServingError(MichelangeloError):
    """Root of the serving errors raised on the driver (deploy, lookup, readiness)."""


class DeploymentError(ServingError):
    """A deployment could not be created or updated; the message says why and the fix."""


class DeploymentNotFoundError(ServingError, InputError, LookupError):
    """No deployment of that name on the connected cluster."""


class ReadinessError(ServingError):
    """A replica loaded a revision but could not prove it serves it correctly."""


class HTTPError(Exception):
    """An answer other than 200; ``status`` is the HTTP status code."""

    status: int = 400

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        if status is not None:
            self.status = status
        self.message = message

    def body(self) -> dict[str, Any]:
        return {"error": self.message}

    def __reduce__(self):  # crosses Ray process boundaries intact
        return (type(self), (self.message, self.status))


class BadRequest(HTTPError):
    """The request itself is wrong: JSON, tensor names, shapes, datatypes, values."""

    status = 400


class ModelFailed(BadRequest):
    """The model itself raised on the request's values (counted against a canary)."""


class NotFound(HTTPError):
    """Unknown path, model name or revision."""

    status = 404


class MethodNotAllowed(HTTPError):
    """A known path asked with the wrong HTTP method."""

    status = 405


class PayloadTooLarge(HTTPError):
    """The body is over the deployment's ``max_request_bytes``."""

    status = 413

    @classmethod
    def over(cls, size: int, limit: int) -> PayloadTooLarge:
        return cls(f"the body has at least {size} bytes, over this deployment's "
                   f"max_request_bytes={limit}. Fix: send fewer rows per request, or deploy "
                   "with a larger max_request_bytes.")


class NotReady(HTTPError):
    """The replica is not (or no longer) ready to answer."""

    status = 503
