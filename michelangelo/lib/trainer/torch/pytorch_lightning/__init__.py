"""LightningTrainer: PyTorch Lightning training loops on Ray Train workers.

Public names only; the implementation lives in the underscored modules next to this file.
"""

from michelangelo.lib.trainer.torch.pytorch_lightning._observer import TrainingObserver
from michelangelo.lib.trainer.torch.pytorch_lightning._param import LightningTrainerParam
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

# Names written in sibling modules that land separately; imported lazily so this package
# works (and imports fast) whichever of them exist yet.
_LAZY = {
    "ExperimentStore": "_experiment_store",
    "FsspecExperimentStore": "_experiment_store",
    "LightningTrainerWithStateDict": "_state_dict",
    "RayModelParallelStrategy": "_fsdp2",
    "comet_profiler_sink": "_profiler_sinks",
    "mlflow_profiler_sink": "_profiler_sinks",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
