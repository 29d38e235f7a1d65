"""Ray Train's Lightning classes, built on the Lightning package the run trains with.

``ray.train.lightning`` builds its strategies, its cluster environment and ``prepare_trainer``
on ``lightning.pytorch`` whenever the ``lightning`` package can be imported, and on
``pytorch_lightning`` only otherwise. A ``Trainer`` refuses the other package's objects, so on
a machine with both packages a ``pytorch_lightning`` run cannot use Ray's classes, and with
only ``pytorch_lightning`` a ``lightning`` run could not either.

:func:`ray_lightning` hands out Ray's own classes when Ray built them on the run's package,
and otherwise this module's builds of them on that package, which behave the same way: the
worker's device is Ray Train's device for that worker, the distributed sampler splits by
Ray's world rank and size, and the cluster environment reads the ranks and sizes from Ray
Train's context instead of setting them.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from collections.abc import Callable
from typing import Any

import ray.train
import ray.train.torch
import torch

__all__ = ["RayLightning", "prepare_trainer", "ray_lightning"]


@dataclasses.dataclass(frozen=True)
class RayLightning:
    """The Ray-aware Lightning classes a ``pytorch_lightning.Trainer`` accepts.

    Attributes:
        ddp, fsdp, deepspeed: The ``RayDDPStrategy``, ``RayFSDPStrategy`` and
            ``RayDeepSpeedStrategy`` classes.
        environment: The ``RayLightningEnvironment`` class (the cluster environment plugin).
        prepare_trainer: Checks a built trainer's strategy and environment, as Ray's does.
        from_ray: Whether these are ``ray.train.lightning``'s own classes.
    """

    ddp: type
    fsdp: type
    deepspeed: type
    environment: type
    prepare_trainer: Callable[[Any], Any]
    from_ray: bool

    @property
    def strategies(self) -> tuple[type, ...]:
        """The three strategy classes ``prepare_trainer`` accepts."""
        return (self.ddp, self.fsdp, self.deepspeed)


@functools.cache
def ray_lightning(package: str = "pytorch_lightning") -> RayLightning:
    """The Ray-aware classes for a ``Trainer`` of ``package`` (``"pytorch_lightning"`` or
    ``"lightning.pytorch"``): Ray's own when Ray built them on it, else this module's builds."""
    import ray.train.lightning as ray_pl

    pl = importlib.import_module(package)
    if issubclass(ray_pl.RayDDPStrategy, pl.strategies.DDPStrategy):
        return RayLightning(ddp=ray_pl.RayDDPStrategy, fsdp=ray_pl.RayFSDPStrategy,
                            deepspeed=ray_pl.RayDeepSpeedStrategy,
                            environment=ray_pl.RayLightningEnvironment,
                            prepare_trainer=ray_pl.prepare_trainer, from_ray=True)
    return _build(package)


class _OnRayWorker:
    """What the three strategies share: the device and the data split come from Ray Train."""

    @property
    def root_device(self) -> torch.device:
        return ray.train.torch.get_device()

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        return {"num_replicas": self.world_size, "rank": self.global_rank}


class _RayEnvironment:
    """Ranks and sizes from Ray Train's context; Lightning may not change them."""

    def world_size(self) -> int:
        return ray.train.get_context().get_world_size()

    def global_rank(self) -> int:
        return ray.train.get_context().get_world_rank()

    def local_rank(self) -> int:
        return ray.train.get_context().get_local_rank()

    def node_rank(self) -> int:
        return ray.train.get_context().get_node_rank()

    def set_world_size(self, size: int) -> None:
        """Ignored: Ray Train fixed the world size when it started the workers."""

    def set_global_rank(self, rank: int) -> None:
        """Ignored: Ray Train gave this worker its rank."""

    def teardown(self) -> None:
        """Nothing to undo: Ray Train owns the processes and their environment."""


@functools.cache
def _build(package: str) -> RayLightning:
    """Ray's four classes and ``prepare_trainer``, built on ``package``."""
    pl = importlib.import_module(package)
    environments = importlib.import_module(f"{package}.plugins.environments")

    def made(name: str, *bases: type, doc: str) -> type:
        return type(name, bases, {"__module__": __name__, "__doc__": f"{doc} ({package} build)",
                                  "__qualname__": name})

    ddp = made("RayDDPStrategy", _OnRayWorker, pl.strategies.DDPStrategy,
               doc="Lightning's DDP on a Ray Train worker")
    fsdp = made("RayFSDPStrategy", _OnRayWorker, pl.strategies.FSDPStrategy,
                doc="Lightning's FSDP on a Ray Train worker")
    deepspeed = made("RayDeepSpeedStrategy", _OnRayWorker, pl.strategies.DeepSpeedStrategy,
                     doc="Lightning's DeepSpeed strategy on a Ray Train worker")
    environment = made("RayLightningEnvironment", _RayEnvironment,
                       environments.LightningEnvironment,
                       doc="Ranks and sizes from Ray Train's context")

    def prepare_trainer(trainer: Any) -> Any:
        """Refuse a trainer whose strategy or cluster environment is not Ray-aware.

        Raises:
            RuntimeError: The strategy is not one of the three, or the cluster environment
                is not ``RayLightningEnvironment``.
        """
        allowed = (ddp, fsdp, deepspeed)
        if not isinstance(trainer.strategy, allowed):
            raise RuntimeError(
                f"The trainer's strategy is {type(trainer.strategy).__name__}; on Ray Train it "
                f"must be one of {[c.__name__ for c in allowed]} (or a subclass).")
        found = getattr(trainer.strategy, "cluster_environment", None)
        if found is not None and not isinstance(found, environment):
            raise RuntimeError(
                f"The trainer's cluster environment is {type(found).__name__}; on Ray Train "
                "it must be RayLightningEnvironment.")
        return trainer

    return RayLightning(ddp=ddp, fsdp=fsdp, deepspeed=deepspeed, environment=environment,
                        prepare_trainer=prepare_trainer, from_ray=False)


def prepare_trainer(trainer: Any) -> Any:
    """``prepare_trainer`` of the build on ``trainer``'s own package (see :func:`_build`).

    Raises:
        RuntimeError: As Ray's ``prepare_trainer``: a strategy or environment not Ray-aware.
    """
    package = "lightning.pytorch" if type(trainer).__module__.startswith("lightning.") \
        else "pytorch_lightning"
    return _build(package).prepare_trainer(trainer)
