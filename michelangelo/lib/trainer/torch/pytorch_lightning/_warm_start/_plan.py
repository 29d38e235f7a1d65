"""Warm starts from the model registry: one driver-side plan, applied on every worker.

Order on a worker: ``create_model_fn`` -> ``initial_weights_path`` -> incremental revision
weights -> inherited layers -> freezing. Each weight step happens as soon as the model has
the names it needs: right away, or once ``configure_model()`` has built them (see
``_model_stages``). Storage is read before ``configure_model()`` either way, so no collective
runs inside Lightning's model-building contexts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from michelangelo.errors import InputError
from michelangelo.lib.trainer.torch.pytorch_lightning._warm_start._incremental import (
    IncrementalPlan,
    check_revision_fits,
    incremental_callback,
    load_revision,
    plan_incremental,
    read_revision,
)
from michelangelo.lib.trainer.torch.pytorch_lightning._warm_start._inherit import (
    InheritPlan,
    apply_inherit,
    plan_inherit,
    read_baseline,
    worker_mapping,
)
from michelangelo.lib.trainer.torch.pytorch_lightning._warm_start._model_stages import (
    AFTER,
    BEFORE,
    MetaModels,
    stage_on_worker,
)

__all__ = ["WarmStart", "apply_warm_start", "at_stage", "plan_warm_start"]


@dataclass(frozen=True)
class WarmStart:
    """Both halves' plans; each may be None."""

    inherit: InheritPlan | None
    incremental: IncrementalPlan | None


def _baseline_of(spec: Any) -> Any:
    return spec.metadata.baseline_model if spec is not None and spec.metadata else None


def plan_warm_start(param: Any, resolved: Any, models: MetaModels | None = None
                    ) -> WarmStart | None:
    """Resolve registry baselines and check them against the model, on the driver.

    The registry is ``ModelRegistry()`` (``$MA_MODEL_REGISTRY_URL``, else uniflow storage),
    resolved here so that workers read the same root whatever their environment.

    Raises:
        ValueError: Any setting that cannot work, before a worker starts.
    """
    transfer, incremental = param.transfer_learning_spec, param.incremental_training_spec
    inherits = transfer is not None and (
        _baseline_of(transfer) is not None or transfer.layer_names_to_inherit
        or transfer.layer_names_to_inherit_regex or transfer.model_loader_function)
    if not inherits and incremental is None:
        return None
    if incremental is not None and param.initial_weights_path:
        raise InputError(
            "LightningTrainerParam sets both initial_weights_path and incremental_training_spec;"
            " both decide the starting weights. Fix: keep one of them.")
    from michelangelo.lib.model_registry import ModelRegistry

    registry = ModelRegistry()
    models = models or MetaModels(param.create_model_fn, param.create_model_fn_kwargs)
    warm = WarmStart(
        inherit=plan_inherit(transfer, models, registry) if inherits else None,
        incremental=plan_incremental(incremental, models, registry, resolved),
    )
    _check_stage_fits_strategy(warm, resolved.strategy)
    return warm


def _partitions_while_configuring(strategy: Any) -> bool:
    """DeepSpeed ZeRO-3 partitions every parameter as ``configure_model()`` creates it."""
    if strategy.instance is not None:
        return bool(getattr(strategy.instance, "zero_stage_3", False))
    if strategy.name != "deepspeed":
        return False
    config = strategy.kwargs.get("config") or {}
    stage = (config.get("zero_optimization") or {}).get("stage") if isinstance(config, dict) \
        else None
    return strategy.kwargs.get("stage") == 3 or stage == 3


def _check_stage_fits_strategy(warm: WarmStart, strategy: Any) -> None:
    late = [what for what, plan in (("TransferLearningSpec", warm.inherit),
                                    ("IncrementalTrainingSpec", warm.incremental))
            if plan is not None and plan.stage == AFTER]
    if late and _partitions_while_configuring(strategy):
        raise InputError(
            f"{' and '.join(late)} must copy into layers that configure_model() creates, but "
            "DeepSpeed ZeRO-3 partitions those layers as they are created, so no worker holds "
            "them whole. Fix: create the layers in __init__ (ZeRO-3 partitions them when "
            "training starts), or use strategy 'deepspeed' with stage 2.")


def at_stage(stage: str, action: Callable[[], None], later: list[Callable[[], None]]) -> None:
    """Run ``action`` now (``BEFORE``) or queue it for after ``configure_model()``."""
    if stage == BEFORE:
        action()
    else:
        later.append(action)


def apply_warm_start(model: Any, warm: WarmStart | None, rank: int, world_size: int,
                     later: list[Callable[[], None]]) -> list[Any]:
    """Load the planned weights into ``model`` now or queue them on ``later``.

    Returns:
        Lightning callbacks to add to the trainer.
    """
    if warm is None:
        return []
    callbacks = []
    if warm.incremental is not None:
        revision = read_revision(warm.incremental, rank, world_size)
        stage = warm.incremental.stage
        if stage is None:  # the driver could not place it: decide from this worker's names
            stage = stage_on_worker(model, lambda m: check_revision_fits(m, revision))
        at_stage(stage, lambda: load_revision(model, revision), later)
        callbacks.append(incremental_callback(warm.incremental, rank, world_size))
    plan = warm.inherit
    if plan is not None:
        baseline = read_baseline(plan.registry_url, plan.baseline, rank, world_size,
                                 "TransferLearningSpec")
        stage = plan.stage
        if plan.mapping is None and plan.loader is None:
            # The driver could not place it: decide from this worker's names.
            stage = stage_on_worker(model, lambda m: worker_mapping(m, plan, baseline))
        at_stage(stage, lambda: apply_inherit(model, plan, rank, world_size, baseline), later)
    return callbacks
