"""``Revision``: what the registry knows about one registered model version (no weights)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from michelangelo.lib.checkpoints import ModelSpec

__all__ = ["Revision"]


@dataclass(frozen=True)
class Revision:
    """Metadata of one revision, as stored in its ``revision.json``.

    Attributes:
        project_name: Registry project.
        model_name: Model inside the project.
        revision_id: 1, 2, 3 ... per model.
        weights_sha256: sha256 of the stored safetensors file, checked on every load.
        created_at: Unix time of registration.
        metrics: Final metrics given at registration (floats, ints, strings).
        description: Free text.
        tags: String key/value pairs.
        aliases: Aliases pointing at this revision now (filled in when read).
        factory: How to rebuild the model: ``{"module", "qualname", "script_path", "kwargs"}``.
        lineage: Where the weights came from: uniflow run/task, training run, checkpoint,
            datasets (with fingerprints), source kind.
        versions: Package versions at registration (python, torch, lightning, ray, ...).
        signature: Open Inference Protocol ``{"inputs": [...], "outputs": [...]}``, or ``{}``.
        input_example: ``{"inputs": {...}, "outputs": {...}}`` replayable example, or None.
        weights_bytes: Size of the weights file.
        num_tensors: Number of entries in the state dict.
        optimizer_state: ``{"sha256", "bytes", "num_optimizers", "epoch", "global_step"}``
            when the revision keeps optimizer state (``keep_optimizer_state=True``), else None.
        created_by: User name of the registering process.
        tokenizer: ``{"kind", "file", "sha256", "bytes"}`` of the tokenizer stored with the
            revision (``register(tokenizer=...)``), else None.
        processing: The text processing spec serving follows (``register(processing=...)``),
            else None.
    """

    project_name: str
    model_name: str
    revision_id: int
    weights_sha256: str
    created_at: float
    metrics: dict[str, Any] = field(default_factory=dict)
    description: str | None = None
    tags: dict[str, str] = field(default_factory=dict)
    aliases: list[str] = field(default_factory=list)
    factory: dict[str, Any] = field(default_factory=dict)
    lineage: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    signature: dict[str, Any] = field(default_factory=dict)
    input_example: dict[str, Any] | None = None
    weights_bytes: int = 0
    num_tensors: int = 0
    optimizer_state: dict[str, Any] | None = None
    created_by: str | None = None
    tokenizer: dict[str, Any] | None = None
    processing: dict[str, Any] | None = None

    @property
    def spec(self) -> ModelSpec:
        """The exact ``ModelSpec`` of this revision (numbered, never an alias)."""
        return ModelSpec(self.project_name, self.model_name, self.revision_id)

    @property
    def name(self) -> str:
        """``project/model:revision``."""
        return f"{self.project_name}/{self.model_name}:{self.revision_id}"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict of every field."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Revision:
        """Rebuild from :meth:`to_dict` output; unknown keys (newer writers) are ignored."""
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def with_aliases(self, aliases: list[str]) -> Revision:
        """A copy with ``aliases`` replaced."""
        return dataclasses.replace(self, aliases=sorted(aliases))
