"""Distributed strategies: a registry of names, each a Ray-aware Lightning strategy.

``choose_strategy`` turns the user's ``strategy`` (a name or a ``Strategy`` object) into
something a worker can build; a new strategy joins the table in ``_registry``, with its class
in a module of its own (``_fsdp2`` for FSDP2). ``ray_lightning`` gives the Ray-aware classes
that a ``pytorch_lightning.Trainer`` accepts: Ray's own, or their ``pytorch_lightning`` builds
(``_ray_lightning``) where Ray built its own on the ``lightning`` package. The strategy classes
load on first use, so resolving a name costs no Lightning or Ray Train import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from michelangelo.lazy import lazy_exports
from michelangelo.lib.trainer.torch.pytorch_lightning._strategies._registry import (
    StrategyChoice,
    choose_strategy,
    register_strategy,
    strategy_names,
)

if TYPE_CHECKING:
    from michelangelo.lib.trainer.torch.pytorch_lightning._strategies._fsdp2 import (
        RayModelParallelStrategy,
        validate_fsdp2_kwargs,
    )
    from michelangelo.lib.trainer.torch.pytorch_lightning._strategies._ray_lightning import (
        RayLightning,
        ray_lightning,
    )

__all__ = [
    "RayLightning",
    "RayModelParallelStrategy",
    "StrategyChoice",
    "choose_strategy",
    "ray_lightning",
    "register_strategy",
    "strategy_names",
    "validate_fsdp2_kwargs",
]

# Loaded on first use: both modules import Lightning and Ray Train.
_LAZY = {name: "_fsdp2" for name in ("RayModelParallelStrategy", "validate_fsdp2_kwargs")} | {
    name: "_ray_lightning" for name in ("RayLightning", "ray_lightning")}
__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
