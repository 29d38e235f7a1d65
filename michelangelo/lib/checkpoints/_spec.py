"""``ModelSpec``: how a model is named in the Model Registry (project, model, revision)."""

from __future__ import annotations

from dataclasses import dataclass

from michelangelo.errors import InputError

__all__ = ["ModelSpec"]


@dataclass(frozen=True)
class ModelSpec:
    """How a model is identified in the Model Registry.

    Args:
        project_name: Registry project that owns the model.
        model_name: Model name inside the project.
        revision_id: A specific revision; None means the latest one.
    """

    project_name: str
    model_name: str
    revision_id: int | str | None = None

    def __post_init__(self) -> None:
        for name in ("project_name", "model_name"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise InputError(
                    f"ModelSpec.{name} must be a non-empty string, got {value!r}. "
                    f"Fix: pass the registry's {name.replace('_', ' ')}."
                )
        if self.revision_id is not None and not isinstance(self.revision_id, int | str):
            raise InputError(
                f"ModelSpec.revision_id must be an int, a str or None, got "
                f"{self.revision_id!r}. Fix: pass the revision number or leave it unset."
            )
