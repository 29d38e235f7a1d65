"""LightningTrainer: PyTorch Lightning training loops on Ray Train workers.

Public names only. The implementation lives in private subpackages, one concept each:
``_config`` (parameters, kwargs resolution, driver-side checks), ``_strategies`` (the strategy
registry), ``_ingest`` (how a worker reads its shard), ``_warm_start`` (initial weights,
registry warm starts, freezing), ``_checkpoints`` (auto-resume and the experiment store) and
``_worker`` (the loop each Ray Train worker runs and what it reports); ``_trainer`` and
``_state_dict`` hold the two trainer classes; ``_poll_interval`` sets how often Ray Train's
controller collects the workers' reports during a fit, and ``_sigint`` puts the process's
SIGINT handler back after it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from michelangelo.lazy import lazy_exports

if TYPE_CHECKING:
    from michelangelo.lib.trainer.torch.pytorch_lightning._checkpoints import (
        ExperimentStore,
        FsspecExperimentStore,
    )
    from michelangelo.lib.trainer.torch.pytorch_lightning._config import (
        LightningTrainerParam,
        TrainingObserver,
    )
    from michelangelo.lib.trainer.torch.pytorch_lightning._errors import TrainingStalledError
    from michelangelo.lib.trainer.torch.pytorch_lightning._fabric import (
        FabricTrainer,
        ray_fabric_kwargs,
    )
    from michelangelo.lib.trainer.torch.pytorch_lightning._state_dict import (
        LightningTrainerWithStateDict,
    )
    from michelangelo.lib.trainer.torch.pytorch_lightning._strategies import (
        RayLightning,
        RayModelParallelStrategy,
        ray_lightning,
    )
    from michelangelo.lib.trainer.torch.pytorch_lightning._trainer import LightningTrainer
    from michelangelo.lib.trainer.torch.pytorch_lightning._worker import (
        comet_profiler_sink,
        mlflow_profiler_sink,
    )
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
    "ExperimentStore": "_checkpoints",
    "FabricTrainer": "_fabric",
    "FsspecExperimentStore": "_checkpoints",
    "IncrementalTrainingSpec": "schema",
    "LearningMode": "schema",
    "LightningTrainer": "_trainer",
    "LightningTrainerParam": "_config",
    "LightningTrainerWithStateDict": "_state_dict",
    "ModelSpec": "schema",
    "RayLightning": "_strategies",
    "RayModelParallelStrategy": "_strategies",
    "TrainingObserver": "_config",
    "TrainingStalledError": "_errors",
    "TransferLearningMetadata": "schema",
    "TransferLearningSpec": "schema",
    "comet_profiler_sink": "_worker",
    "mlflow_profiler_sink": "_worker",
    "ray_fabric_kwargs": "_fabric",
    "ray_lightning": "_strategies",
}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())

__all__ = [
    "ExperimentStore",
    "FabricTrainer",
    "FsspecExperimentStore",
    "IncrementalTrainingSpec",
    "LearningMode",
    "LightningTrainer",
    "LightningTrainerParam",
    "LightningTrainerWithStateDict",
    "ModelSpec",
    "RayLightning",
    "RayModelParallelStrategy",
    "TrainingObserver",
    "TrainingStalledError",
    "TransferLearningMetadata",
    "TransferLearningSpec",
    "comet_profiler_sink",
    "mlflow_profiler_sink",
    "ray_fabric_kwargs",
    "ray_lightning",
]
