"""FSDP2 on Ray Train: a Ray-aware ``ModelParallelStrategy`` and the driver-side kwarg check.

Ray Train ships Ray flavours of Lightning's DDP, FSDP and DeepSpeed strategies but none of
``ModelParallelStrategy`` (Lightning's FSDP2 / DTensor strategy). ``RayModelParallelStrategy``
fills that gap. Ray Train already owns the process group, the world size and the device of
each worker, so the strategy takes all three from Ray instead of from its own arguments, and
``validate_fsdp2_kwargs`` rejects the arguments that would contradict Ray on the driver,
before any worker starts.
"""

from __future__ import annotations

import functools
import importlib
import warnings
from typing import Any

import pytorch_lightning as pl
import ray.train.torch
import torch
import torch.distributed
from pytorch_lightning.plugins.environments import ClusterEnvironment

from michelangelo.errors import InputError, InputTypeError
from michelangelo.lib.trainer.torch.pytorch_lightning._strategies._ray_lightning import (
    ray_lightning,
)

__all__ = ["RayModelParallelStrategy", "ray_model_parallel", "validate_fsdp2_kwargs"]

# Each entry: the reason Ray Train owns the setting, and what to do instead.
_RAY_OWNED_KWARGS: dict[str, tuple[str, str]] = {
    "tensor_parallel_size": (
        "tensor parallelism is not supported: FSDP2 here shards over data parallelism only",
        "remove it; every Ray Train worker is one data-parallel shard",
    ),
    "data_parallel_size": (
        "FSDP2 always shards across the full Ray Train world size",
        "remove it and change ScalingConfig(num_workers=...) instead",
    ),
    "process_group_backend": (
        "Ray Train creates the process group before Lightning starts",
        "remove it and set ray.train.torch.TorchConfig(backend=...) on the trainer instead",
    ),
    "timeout": (
        "Ray Train creates the process group before Lightning starts",
        "remove it and set ray.train.torch.TorchConfig(timeout_s=...) on the trainer instead",
    ),
}


def validate_fsdp2_kwargs(strategy_kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """Check ``strategy_kwargs`` meant for the ``"fsdp2"`` strategy, on the driver.

    Args:
        strategy_kwargs: Keyword arguments the user wants passed to
            ``RayModelParallelStrategy``. ``None`` is treated as empty.

    Returns:
        A new dict safe to pass to ``RayModelParallelStrategy(**kwargs)``; the input is not
        modified. ``save_distributed_checkpoint`` is always ``True`` in it.

    Raises:
        ValueError: If a key that Ray Train owns (``tensor_parallel_size``,
            ``data_parallel_size``, ``process_group_backend``, ``timeout``) is present.
        TypeError: If ``strategy_kwargs`` is not a dict.
    """
    if strategy_kwargs is None:
        return {"save_distributed_checkpoint": True}
    if not isinstance(strategy_kwargs, dict):
        raise InputTypeError(
            "lightning_trainer_kwargs['strategy_kwargs'] must be a dict for strategy='fsdp2', "
            f"got {type(strategy_kwargs).__name__}: {strategy_kwargs!r}."
        )
    for key, (why, fix) in _RAY_OWNED_KWARGS.items():
        if key in strategy_kwargs:
            raise InputError(
                f"strategy_kwargs[{key!r}]={strategy_kwargs[key]!r} is not allowed with "
                f"strategy='fsdp2': {why}. Fix: {fix}."
            )
    cleaned = dict(strategy_kwargs)
    if cleaned.get("save_distributed_checkpoint", True) is not True:
        warnings.warn(
            "strategy_kwargs['save_distributed_checkpoint']="
            f"{cleaned['save_distributed_checkpoint']!r} is not supported with strategy='fsdp2'; "
            "it is forced to True because each worker writes its own shard of the checkpoint. "
            "Remove the key to silence this warning; use "
            "LightningTrainerWithStateDict.update_model_state_dict to get full weights.",
            UserWarning,
            stacklevel=2,
        )
    cleaned["save_distributed_checkpoint"] = True
    return cleaned


class _RayModelParallel:
    """What the Ray builds of ``ModelParallelStrategy`` add; see :class:`RayModelParallelStrategy`."""

    _package = "pytorch_lightning"

    def __init__(self, **kwargs: Any) -> None:
        cleaned = validate_fsdp2_kwargs(kwargs)
        # The real sizes are only known inside the worker, in setup_environment.
        super().__init__(data_parallel_size="auto", tensor_parallel_size="auto", **cleaned)

    # Lightning's ParallelStrategy keeps the environment as a plain attribute. A property here
    # keeps it None until the Trainer hands one over (so giving Ray's as a plugin too is no
    # conflict), then holds on to Ray's.
    @property
    def cluster_environment(self) -> ClusterEnvironment | None:
        return self._ray_environment

    @cluster_environment.setter
    def cluster_environment(self, environment: ClusterEnvironment | None) -> None:
        if environment is not None:  # None comes from __init__, before the Trainer
            ray_environment = ray_lightning(self._package).environment
            if not isinstance(environment, ray_environment):
                environment = ray_environment()
        self._ray_environment = environment

    @property
    def root_device(self) -> torch.device:
        return ray.train.torch.get_device()

    @property
    def num_processes(self) -> int:
        # One Ray Train worker is one process with one device.
        return 1

    def setup_environment(self) -> None:
        # world_size comes from the cluster environment (Ray's train context), which is valid
        # from here on; set both sizes explicitly so the parent never guesses.
        self._data_parallel_size = self.world_size
        self._tensor_parallel_size = 1
        super().setup_environment()

    def _get_process_group_backend(self) -> str:
        # Ray initialised the group already; report its real backend rather than a guess.
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            return str(torch.distributed.get_backend())
        return super()._get_process_group_backend()


class RayModelParallelStrategy(_RayModelParallel, pl.strategies.ModelParallelStrategy):
    """Lightning's ``ModelParallelStrategy`` (FSDP2) running inside a Ray Train worker.

    Differences from the parent, all because Ray Train already set the worker up:

    * ``root_device`` is ``ray.train.torch.get_device()`` (CPU or the worker's GPU).
    * ``data_parallel_size`` is the Ray Train world size and ``tensor_parallel_size`` is 1,
      fixed when the environment is set up. Lightning's ``"auto"`` would assume one node and
      fail its ``dp * tp == world_size`` check on a multi-worker Ray run.
    * The process group Ray created is reused, with whatever backend it has (gloo on CPU).

    The LightningModule must implement ``configure_model()`` and apply
    ``torch.distributed.fsdp.fully_shard`` there, as with the parent strategy. Its cluster
    environment is always Ray's ``RayLightningEnvironment`` on ``pytorch_lightning`` (Ray's
    class, or this package's build of it where Ray built its own on the ``lightning``
    package). A hand-written Ray Train loop may pass that class as a plugin, as Ray's docs do,
    or pass none. Lightning's own choice (``LightningEnvironment``, or Kubeflow's on a
    Kubernetes pod) would count one process per node and shard over a world of one, so the
    strategy swaps it for Ray's. Do not pass it through ``prepare_trainer``, which rejects it.

    Args:
        **kwargs: Forwarded to ``ModelParallelStrategy``. Checked with
            ``validate_fsdp2_kwargs`` so that Ray-owned settings cannot slip in.
    """


@functools.cache
def ray_model_parallel(package: str = "pytorch_lightning") -> type:
    """:class:`RayModelParallelStrategy` built on ``package`` (the run's Lightning package)."""
    if package == "pytorch_lightning":
        return RayModelParallelStrategy
    pl_package = importlib.import_module(package)
    return type("RayModelParallelStrategy",
                (_RayModelParallel, pl_package.strategies.ModelParallelStrategy),
                {"__module__": __name__, "_package": package,
                 "__doc__": f"RayModelParallelStrategy ({package} build)."})
