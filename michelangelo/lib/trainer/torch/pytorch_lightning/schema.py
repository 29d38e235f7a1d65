"""Spec metadata for warm starts: transfer learning and incremental training.

The public home of the specs a ``LightningTrainerParam`` takes; they are defined with the
rest of the run's configuration (``_config``). Importing them costs no Lightning or Ray
Train import.
"""

from michelangelo.lib.checkpoints import ModelSpec
from michelangelo.lib.trainer.torch.pytorch_lightning._config import (
    IncrementalTrainingSpec,
    LearningMode,
    TransferLearningMetadata,
    TransferLearningSpec,
)

__all__ = [
    "IncrementalTrainingSpec",
    "LearningMode",
    "ModelSpec",
    "TransferLearningMetadata",
    "TransferLearningSpec",
]
