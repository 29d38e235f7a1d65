"""Strategy resolution: a ``strategy`` string or object becomes a Ray-aware Lightning strategy.

Each strategy registers itself (:func:`register_strategy`: its name, a class loader, whether
it shards, its kwarg check), so a new one joins without touching the trainer or any name test. Precedence: a ``Strategy`` instance passes through untouched;
None means "ddp"; a string must be a registered name.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from michelangelo.errors import InputError

__all__ = ["StrategyChoice", "choose_strategy", "register_strategy", "strategy_names"]


def _ray_ddp(package: str) -> type:
    return _ray_lightning(package).ddp


def _ray_fsdp(package: str) -> type:
    return _ray_lightning(package).fsdp


def _ray_deepspeed(package: str) -> type:
    try:
        import deepspeed  # noqa: F401
    except ImportError as error:
        raise InputError(
            "lightning_trainer_kwargs['strategy']='deepspeed' needs DeepSpeed, which is not "
            f"installed ({error}). Fix: install the trainer-deepspeed extra."
        ) from None
    return _ray_lightning(package).deepspeed


def _ray_lightning(package: str) -> Any:
    # Ray's classes where Ray built them on the run's package, else their builds on it
    # (see _ray_lightning).
    from michelangelo.lib.trainer.torch.pytorch_lightning._strategies._ray_lightning import (
        ray_lightning,
    )

    return ray_lightning(package)


def _ray_fsdp2(package: str) -> type:
    from michelangelo.lib.trainer.torch.pytorch_lightning._strategies._fsdp2 import (
        ray_model_parallel,
    )

    return ray_model_parallel(package)


def _check_fsdp2_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    from michelangelo.lib.trainer.torch.pytorch_lightning._strategies._fsdp2 import (
        validate_fsdp2_kwargs,
    )

    return validate_fsdp2_kwargs(kwargs)


@dataclass(frozen=True)
class _Entry:
    load: Callable[[str], type]  # the run's Lightning package -> the class built on it
    check_kwargs: Callable[[dict[str, Any]], dict[str, Any]] = dict
    # prepare_trainer only accepts the three Ray strategy classes.
    ray_prepared: bool = True
    # Parameters, gradients and optimizer state split across the workers.
    shards: bool = False


_REGISTRY: dict[str, _Entry] = {}


def register_strategy(name: str, load: Callable[[str], type], *, shards: bool = False,
                      check_kwargs: Callable[[dict[str, Any]], dict[str, Any]] = dict,
                      ray_prepared: bool = True) -> None:
    """Make ``strategy=name`` resolve to the class ``load()`` returns.

    Args:
        name: The ``lightning_trainer_kwargs['strategy']`` string (lower case).
        load: ``load(package)`` returns the class built on the run's Lightning package
            (``"pytorch_lightning"`` or ``"lightning.pytorch"``); called only when the name is
            chosen, so registering imports nothing heavy.
        shards: Whether the strategy splits parameters, gradients and optimizer state across
            the workers (the memory preflight and the clipping check read it).
        check_kwargs: Checks and completes the ``strategy_kwargs`` on the driver.
        ray_prepared: Whether Ray's ``prepare_trainer`` accepts the class.
    """
    if name != name.lower() or name in _REGISTRY:
        raise InputError(f"strategy name {name!r} is taken or not lower case; registered: "
                         f"{sorted(_REGISTRY)}. Fix: register a new lower-case name.")
    _REGISTRY[name] = _Entry(load, check_kwargs, ray_prepared, shards)


register_strategy("ddp", _ray_ddp)
register_strategy("fsdp", _ray_fsdp, shards=True)
register_strategy("fsdp2", _ray_fsdp2, shards=True, check_kwargs=_check_fsdp2_kwargs,
                  ray_prepared=False)
register_strategy("deepspeed", _ray_deepspeed)


def _sharding_bases() -> tuple[type, ...]:
    """Lightning's sharding strategy classes (FSDP, ModelParallel) of each Lightning package
    already imported (a strategy instance's package always is); every sharding strategy
    registered here derives from one of them."""
    bases = []
    for package in ("pytorch_lightning", "lightning.pytorch"):
        strategies = sys.modules.get(f"{package}.strategies")
        if strategies is not None:
            bases += [strategies.FSDPStrategy, strategies.ModelParallelStrategy]
    return tuple(bases)


def strategy_names() -> list[str]:
    """The accepted ``strategy`` strings."""
    return sorted(_REGISTRY)


@dataclass(frozen=True)
class StrategyChoice:
    """A resolved strategy: a registered name with checked kwargs, or a user's instance.

    The Lightning strategy object itself is built on each worker by :meth:`build`, so
    nothing stateful is pickled for named strategies.
    """

    name: str | None
    kwargs: dict[str, Any] = field(default_factory=dict)
    instance: Any = None
    package: str = "pytorch_lightning"  # the run's Lightning package

    def build(self) -> Any:
        """The Lightning ``Strategy`` for this worker."""
        if self.instance is not None:
            return self.instance
        return _REGISTRY[self.name].load(self.package)(**self.kwargs)

    @property
    def ray_prepared(self) -> bool:
        """Whether ``prepare_trainer`` (Ray's, or its build on the run's package) accepts it."""
        if self.instance is not None:
            return isinstance(self.instance, _ray_lightning(self.package).strategies)
        return _REGISTRY[self.name].ray_prepared

    @property
    def label(self) -> str:
        """The strategy name, or the instance's class name."""
        return self.name if self.instance is None else type(self.instance).__name__

    @property
    def shards_parameters(self) -> bool:
        """Whether parameters, gradients and optimizer state are split across workers."""
        if self.instance is not None:
            return isinstance(self.instance, _sharding_bases())
        return _REGISTRY[self.name].shards


def choose_strategy(strategy: Any, strategy_kwargs: Any,
                    package: str = "pytorch_lightning") -> StrategyChoice:
    """Resolve ``lightning_trainer_kwargs['strategy']`` and its ``strategy_kwargs``, on the driver.

    Args:
        strategy: None, a registered name, or a ``Strategy`` instance of ``package``.
        strategy_kwargs: Constructor arguments for a named strategy, or None.
        package: The run's Lightning package (the module's): ``"pytorch_lightning"`` or
            ``"lightning.pytorch"``.

    Returns:
        The resolved :class:`StrategyChoice`.

    Raises:
        ValueError: Unknown name, wrong type, kwargs with an instance, or kwargs the
            strategy rejects.
    """
    import importlib

    other = "lightning.pytorch" if package == "pytorch_lightning" else "pytorch_lightning"
    Strategy = importlib.import_module(f"{package}.strategies").Strategy  # noqa: N806

    if strategy_kwargs is not None and not isinstance(strategy_kwargs, dict):
        raise InputError(
            f"lightning_trainer_kwargs['strategy_kwargs'] must be a dict, got "
            f"{type(strategy_kwargs).__name__}: {strategy_kwargs!r}. Fix: pass a dict of "
            "constructor arguments for the strategy."
        )
    kwargs = dict(strategy_kwargs or {})
    if isinstance(strategy, Strategy):
        if kwargs:
            raise InputError(
                f"lightning_trainer_kwargs['strategy_kwargs']={kwargs!r} cannot be combined with "
                f"a strategy instance ({type(strategy).__name__}). Fix: pass the arguments to "
                "the instance's constructor, or give the strategy as a string."
            )
        return StrategyChoice(name=None, instance=strategy, package=package)
    if strategy is None:
        strategy = "ddp"
    if _from_package(strategy, other):
        raise InputError(
            f"lightning_trainer_kwargs['strategy']={strategy!r} is a {other} strategy "
            "(Ray's RayDDPStrategy, RayFSDPStrategy and RayDeepSpeedStrategy are built on "
            "lightning.pytorch whenever the `lightning` package is installed), but this run's "
            f"LightningModule is built on {package}, whose Trainer refuses it. Fix: give the "
            f"strategy by name, one of {strategy_names()}, with its arguments in "
            f"strategy_kwargs (each name is the Ray-aware strategy, built on {package}), or "
            f"pass a {package}.strategies.Strategy instance."
        )
    if not isinstance(strategy, str) or strategy.lower() not in _REGISTRY:
        raise InputError(
            f"lightning_trainer_kwargs['strategy']={strategy!r} is not supported. Fix: use one "
            f"of {strategy_names()} (or None for 'ddp'), or pass a "
            f"{package}.strategies.Strategy instance."
        )
    name = strategy.lower()
    entry = _REGISTRY[name]
    entry.load(package)  # fails here, on the driver, when an optional dependency is missing
    try:
        kwargs = entry.check_kwargs(kwargs)
    except TypeError as error:
        raise InputError(str(error)) from None
    _check_constructor(name, entry.load(package), kwargs)
    return StrategyChoice(name=name, kwargs=kwargs, package=package)


def _from_package(obj: Any, package: str) -> bool:
    """Whether ``obj`` is an instance of a class built on ``package``."""
    return any(base.__module__.startswith(f"{package}.") for base in type(obj).__mro__)


def _check_constructor(name: str, cls: type, kwargs: dict[str, Any]) -> None:
    # Bind without constructing: constructing some strategies touches devices.
    import inspect

    signature = inspect.signature(cls.__init__)
    if any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values()):
        # Ray's wrappers take **kwargs; check against the Lightning parent instead.
        for base in cls.__mro__[1:]:
            if base.__module__.startswith(("pytorch_lightning", "lightning.pytorch")):
                signature = inspect.signature(base.__init__)
                break
    if any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values()):
        return
    unknown = [k for k in kwargs if k not in signature.parameters]
    if unknown:
        valid = [p for p in signature.parameters if p != "self"]
        raise InputError(
            f"lightning_trainer_kwargs['strategy_kwargs'] has {unknown} that "
            f"strategy={name!r} ({cls.__name__}) does not accept. Fix: use only {valid}."
        )
