"""LightningTrainer: PyTorch Lightning training loops on Ray Train workers.

Public names only; the implementation lives in the underscored modules next to this file.
"""

from michelangelo.lib.trainer.torch.pytorch_lightning._experiment_store import (
    ExperimentStore,
    FsspecExperimentStore,
)
from michelangelo.lib.trainer.torch.pytorch_lightning._fsdp2 import RayModelParallelStrategy
from michelangelo.lib.trainer.torch.pytorch_lightning._observer import TrainingObserver
from michelangelo.lib.trainer.torch.pytorch_lightning._param import LightningTrainerParam
from michelangelo.lib.trainer.torch.pytorch_lightning._profiler_sinks import (
    comet_profiler_sink,
    mlflow_profiler_sink,
)
from michelangelo.lib.trainer.torch.pytorch_lightning._state_dict import (
    LightningTrainerWithStateDict,
)
from michelangelo.lib.trainer.torch.pytorch_lightning._trainer import LightningTrainer
from michelangelo.lib.trainer.torch.pytorch_lightning.schema import (
    IncrementalTrainingSpec,
    LearningMode,
    ModelSpec,
    TransferLearningMetadata,
    TransferLearningSpec,
)

__all__ = [
    "ExperimentStore",
    "FsspecExperimentStore",
    "IncrementalTrainingSpec",
    "LearningMode",
    "LightningTrainer",
    "LightningTrainerParam",
    "LightningTrainerWithStateDict",
    "ModelSpec",
    "RayModelParallelStrategy",
    "TrainingObserver",
    "TransferLearningMetadata",
    "TransferLearningSpec",
    "comet_profiler_sink",
    "mlflow_profiler_sink",
]
