"""Exceptions of the model registry: one root, each a ``ValueError`` so callers can catch broadly."""

from __future__ import annotations

__all__ = ["ModelRegistryError", "RevisionNotFoundError", "WeightsIntegrityError"]


class ModelRegistryError(ValueError):
    """Root of every error the registry raises on purpose."""


class RevisionNotFoundError(ModelRegistryError, LookupError):
    """The project, model, revision or alias asked for does not exist."""


class WeightsIntegrityError(ModelRegistryError):
    """A revision's stored weights no longer match the sha256 recorded when it was registered."""
