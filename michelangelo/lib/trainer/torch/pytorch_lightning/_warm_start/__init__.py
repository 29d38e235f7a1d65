"""Weights a run starts from: ``initial_weights_path``, registry warm starts, freezing.

The driver plans each step once (``plan_warm_start``, ``check_weights_path``): which
baseline layers to inherit, which revision to continue, and at which model stage each applies
(before or after ``configure_model()``, see ``_model_stages``); every worker then applies the
plan, reading storage once on rank 0 and broadcasting it.
"""

from michelangelo.lib.trainer.torch.pytorch_lightning._warm_start._freeze import (
    freeze_layers,
    frozen_names,
)
from michelangelo.lib.trainer.torch.pytorch_lightning._warm_start._model_stages import (
    AFTER,
    BEFORE,
    MetaModels,
    first_stage_that_fits,
    run_after_configure,
    stage_on_worker,
)
from michelangelo.lib.trainer.torch.pytorch_lightning._warm_start._plan import (
    WarmStart,
    apply_warm_start,
    at_stage,
    plan_warm_start,
)
from michelangelo.lib.trainer.torch.pytorch_lightning._warm_start._weights import (
    apply_initial_weights,
    check_initial_weights_fit,
    check_weights_path,
    local_state_dict_shapes,
    read_initial_weights,
)

__all__ = [
    "AFTER",
    "BEFORE",
    "MetaModels",
    "WarmStart",
    "apply_initial_weights",
    "apply_warm_start",
    "at_stage",
    "check_initial_weights_fit",
    "check_weights_path",
    "first_stage_that_fits",
    "freeze_layers",
    "frozen_names",
    "local_state_dict_shapes",
    "plan_warm_start",
    "read_initial_weights",
    "run_after_configure",
    "stage_on_worker",
]
