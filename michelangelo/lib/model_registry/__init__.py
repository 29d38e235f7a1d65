"""Model registry: versioned, lineage-carrying model revisions on any fsspec storage.

Public names only; the implementation lives in the underscored modules next to this file.
"""

from michelangelo.lib.checkpoints import ModelSpec
from michelangelo.lib.model_registry._errors import (
    ModelRegistryError,
    RevisionNotFoundError,
    WeightsIntegrityError,
)
from michelangelo.lib.model_registry._registry import (
    ENV_REGISTRY_URL,
    ModelRegistry,
    registry_url,
)
from michelangelo.lib.model_registry._revision import Revision
from michelangelo.lib.model_registry._spec import parse_model_spec
from michelangelo.lib.model_registry._tokenizer import CharacterTokenizer, TextTokenizer

__all__ = [
    "CharacterTokenizer",
    "ENV_REGISTRY_URL",
    "ModelRegistry",
    "ModelRegistryError",
    "ModelSpec",
    "Revision",
    "RevisionNotFoundError",
    "TextTokenizer",
    "WeightsIntegrityError",
    "parse_model_spec",
    "registry_url",
]
