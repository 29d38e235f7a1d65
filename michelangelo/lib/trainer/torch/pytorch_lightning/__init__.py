"""LightningTrainer: PyTorch Lightning training loops on Ray Train workers.

Public names only; the implementation lives in the underscored modules next to this file.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

# Loaded on first use: ``ModelSpec`` and the ``schema`` specs come without paying for
# Lightning and Ray Train. (``ModelSpec`` itself lives in ``michelangelo.lib.checkpoints``.)
_LAZY = {
    "ExperimentStore": "_experiment_store",
    "FsspecExperimentStore": "_experiment_store",
    "IncrementalTrainingSpec": "schema",
    "LearningMode": "schema",
    "LightningTrainer": "_trainer",
    "LightningTrainerParam": "_param",
    "LightningTrainerWithStateDict": "_state_dict",
    "ModelSpec": "schema",
    "RayModelParallelStrategy": "_fsdp2",
    "TrainingObserver": "_observer",
    "TransferLearningMetadata": "schema",
    "TransferLearningSpec": "schema",
    "comet_profiler_sink": "_profiler_sinks",
    "mlflow_profiler_sink": "_profiler_sinks",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


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
