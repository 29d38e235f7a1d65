"""Ray Train's Lightning classes, always built on ``pytorch_lightning``.

``ray.train.lightning`` builds its strategies, its cluster environment and ``prepare_trainer``
on ``lightning.pytorch`` whenever the ``lightning`` package can be imported, and on
``pytorch_lightning`` only otherwise. LightningTrainer trains ``pytorch_lightning`` modules
with a ``pytorch_lightning.Trainer``, which refuses the other package's objects. So on a
machine with both packages installed (the GPU check's CUDA image has both) every worker
failed in ``pl.Trainer(...)`` with "invalid strategy" or "invalid type for plugin".

:func:`ray_lightning` hands out Ray's own classes when Ray built them on
``pytorch_lightning`` (the usual case: only that package installed), and otherwise the
classes of this module, which behave the same way on ``pytorch_lightning``: the worker's
device is Ray Train's device for that worker, the distributed sampler splits by Ray's world
rank and size, and the cluster environment reads the ranks and sizes from Ray Train's context
instead of setting them.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import pytorch_lightning as pl
import ray.train
import ray.train.torch
import torch
from pytorch_lightning.plugins.environments import LightningEnvironment
from typing_extensions import override

__all__ = ["RayLightning", "ray_lightning"]


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
def ray_lightning() -> RayLightning:
    """Ray's classes when they are built on ``pytorch_lightning``, else this module's."""
    import ray.train.lightning as ray_pl

    if issubclass(ray_pl.RayDDPStrategy, pl.strategies.DDPStrategy):
        return RayLightning(ddp=ray_pl.RayDDPStrategy, fsdp=ray_pl.RayFSDPStrategy,
                            deepspeed=ray_pl.RayDeepSpeedStrategy,
                            environment=ray_pl.RayLightningEnvironment,
                            prepare_trainer=ray_pl.prepare_trainer, from_ray=True)
    return RayLightning(ddp=RayDDPStrategy, fsdp=RayFSDPStrategy, deepspeed=RayDeepSpeedStrategy,
                        environment=RayLightningEnvironment, prepare_trainer=prepare_trainer,
                        from_ray=False)


class _OnRayWorker:
    """What the three strategies share: the device and the data split come from Ray Train."""

    @property
    def root_device(self) -> torch.device:
        return ray.train.torch.get_device()

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        return {"num_replicas": self.world_size, "rank": self.global_rank}


class RayDDPStrategy(_OnRayWorker, pl.strategies.DDPStrategy):
    """Lightning's DDP on a Ray Train worker (``pytorch_lightning`` build)."""


class RayFSDPStrategy(_OnRayWorker, pl.strategies.FSDPStrategy):
    """Lightning's FSDP on a Ray Train worker (``pytorch_lightning`` build)."""


class RayDeepSpeedStrategy(_OnRayWorker, pl.strategies.DeepSpeedStrategy):
    """Lightning's DeepSpeed strategy on a Ray Train worker (``pytorch_lightning`` build)."""


class RayLightningEnvironment(LightningEnvironment):
    """Ranks and sizes from Ray Train's context; Lightning may not change them."""

    @override
    def world_size(self) -> int:
        return ray.train.get_context().get_world_size()

    @override
    def global_rank(self) -> int:
        return ray.train.get_context().get_world_rank()

    @override
    def local_rank(self) -> int:
        return ray.train.get_context().get_local_rank()

    @override
    def node_rank(self) -> int:
        return ray.train.get_context().get_node_rank()

    @override
    def set_world_size(self, size: int) -> None:
        """Ignored: Ray Train fixed the world size when it started the workers."""

    @override
    def set_global_rank(self, rank: int) -> None:
        """Ignored: Ray Train gave this worker its rank."""

    @override
    def teardown(self) -> None:
        """Nothing to undo: Ray Train owns the processes and their environment."""


def prepare_trainer(trainer: pl.Trainer) -> pl.Trainer:
    """Refuse a trainer whose strategy or cluster environment is not Ray-aware.

    Raises:
        RuntimeError: The strategy is not one of this module's three, or the cluster
            environment is not :class:`RayLightningEnvironment`.
    """
    allowed = (RayDDPStrategy, RayFSDPStrategy, RayDeepSpeedStrategy)
    if not isinstance(trainer.strategy, allowed):
        raise RuntimeError(
            f"The trainer's strategy is {type(trainer.strategy).__name__}; on Ray Train it must "
            f"be one of {[c.__name__ for c in allowed]} (or a subclass).")
    environment = getattr(trainer.strategy, "cluster_environment", None)
    if environment is not None and not isinstance(environment, RayLightningEnvironment):
        raise RuntimeError(
            f"The trainer's cluster environment is {type(environment).__name__}; on Ray Train "
            "it must be RayLightningEnvironment.")
    return trainer
