"""Warm starts from the model registry: one driver-side plan, applied on every worker.

Order on a worker: ``create_model_fn`` -> ``initial_weights_path`` -> incremental revision
weights -> inherited layers -> freezing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from michelangelo.lib.trainer.torch.pytorch_lightning._incremental import (
    IncrementalPlan,
    apply_incremental,
    plan_incremental,
)
from michelangelo.lib.trainer.torch.pytorch_lightning._inherit import (
    InheritPlan,
    apply_inherit,
    plan_inherit,
)

__all__ = ["WarmStart", "apply_warm_start", "plan_warm_start"]


@dataclass(frozen=True)
class WarmStart:
    """Both halves' plans; each may be None."""

    inherit: InheritPlan | None
    incremental: IncrementalPlan | None


def _baseline_of(spec: Any) -> Any:
    return spec.metadata.baseline_model if spec is not None and spec.metadata else None


def plan_warm_start(param: Any, resolved: Any) -> WarmStart | None:
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
        raise ValueError(
            "LightningTrainerParam sets both initial_weights_path and incremental_training_spec;"
            " both decide the starting weights. Fix: keep one of them.")
    from michelangelo.lib.model_registry import ModelRegistry
    from michelangelo.lib.trainer.torch.pytorch_lightning._preflight import build_meta_model

    registry = ModelRegistry()
    model = build_meta_model(param.create_model_fn, param.create_model_fn_kwargs)
    return WarmStart(
        inherit=plan_inherit(transfer, model, registry) if inherits else None,
        incremental=plan_incremental(incremental, model, registry, resolved),
    )


def apply_warm_start(model: Any, warm: WarmStart | None, rank: int, world_size: int
                     ) -> list[Any]:
    """Load the planned weights into ``model``; return Lightning callbacks to add."""
    if warm is None:
        return []
    callback = apply_incremental(model, warm.incremental, rank, world_size)
    apply_inherit(model, warm.inherit, rank, world_size)
    return [callback] if callback is not None else []
