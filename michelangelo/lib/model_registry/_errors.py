"""Exceptions of the model registry: one root, each a ``ValueError`` so callers can catch broadly."""

from __future__ import annotations

from michelangelo.errors import InputError, MichelangeloError, ServiceError

__all__ = ["ModelRegistryError", "RevisionNotFoundError", "WeightsIntegrityError"]


class ModelRegistryError(MichelangeloError, ValueError):
    """Root of every error the registry raises on purpose."""


class RevisionNotFoundError(ModelRegistryError, InputError, LookupError):
    """The project, model, revision or alias asked for does not exist."""


class WeightsIntegrityError(ModelRegistryError, ServiceError):
    """A revision's stored weights no longer match the sha256 recorded when it was registered."""
