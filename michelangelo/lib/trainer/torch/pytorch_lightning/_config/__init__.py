"""What a run asks for, resolved and checked on the driver before any worker starts.

The parameters (``LightningTrainerParam``, the warm-start specs, ``TrainingObserver``),
``lightning_trainer_kwargs`` resolved into Lightning's arguments, and the checks that need
more than one field: keyword names against signatures, values against Lightning's own rules,
and the memory preflight. Private to the trainer; the public names are re-exported by
``michelangelo.lib.trainer.torch.pytorch_lightning`` and its ``schema`` module.
"""

from michelangelo.lib.trainer.torch.pytorch_lightning._config._lightning_kwargs import (
    ResolvedKwargs,
    resolve_lightning_kwargs,
)
from michelangelo.lib.trainer.torch.pytorch_lightning._config._observer import TrainingObserver
from michelangelo.lib.trainer.torch.pytorch_lightning._config._param import LightningTrainerParam
from michelangelo.lib.trainer.torch.pytorch_lightning._config._preflight import (
    DeferredMemoryCheck,
    build_meta_model,
    check_memory,
    count_meta_parameters,
)
from michelangelo.lib.trainer.torch.pytorch_lightning._config._specs import (
    IncrementalTrainingSpec,
    LearningMode,
    TransferLearningMetadata,
    TransferLearningSpec,
)
from michelangelo.lib.trainer.torch.pytorch_lightning._config._validation import check_all

__all__ = [
    "DeferredMemoryCheck",
    "IncrementalTrainingSpec",
    "LearningMode",
    "LightningTrainerParam",
    "ResolvedKwargs",
    "TrainingObserver",
    "TransferLearningMetadata",
    "TransferLearningSpec",
    "build_meta_model",
    "check_all",
    "check_memory",
    "count_meta_parameters",
    "resolve_lightning_kwargs",
]
