"""Distributed strategies: a registry of names, each a Ray-aware Lightning strategy.

``choose_strategy`` turns the user's ``strategy`` (a name or a ``Strategy`` object) into
something a worker can build; a new strategy joins the table in ``_registry``, with its class
in a module of its own (``_fsdp2`` for FSDP2). The strategy classes load on first use, so
resolving a name costs no Lightning or Ray Train import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from michelangelo.lib.trainer.torch.pytorch_lightning._strategies._registry import (
    StrategyChoice,
    choose_strategy,
    strategy_names,
)

if TYPE_CHECKING:
    from michelangelo.lib.trainer.torch.pytorch_lightning._strategies._fsdp2 import (
        RayModelParallelStrategy,
        validate_fsdp2_kwargs,
    )

_FSDP2 = ("RayModelParallelStrategy", "validate_fsdp2_kwargs")


def __getattr__(name: str) -> Any:
    if name not in _FSDP2:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from michelangelo.lib.trainer.torch.pytorch_lightning._strategies import _fsdp2

    return getattr(_fsdp2, name)


__all__ = [
    "RayModelParallelStrategy",
    "StrategyChoice",
    "choose_strategy",
    "strategy_names",
    "validate_fsdp2_kwargs",
]
