"""Memory preflight: will the model's persistent training state fit one worker?

The model is built on the ``meta`` device on the driver (no memory, no weights), its
parameters are counted, and the bytes each worker must hold for the whole run are estimated:

* 16 bytes per parameter for Adam/AdamW: 4 for the fp32 weight, 4 for its gradient and 8 for
  the two moments. Under ``bf16-mixed`` Lightning keeps the weights in fp32 and autocasts, so
  the figure is the same as plain fp32; we use 16 in both cases (we do not model an fp16
  weight copy next to a master copy, which a pure half-precision setup would add).
* DDP replicates all of it. FSDP / FSDP2 / DeepSpeed ZeRO-3 split all 16 bytes across the
  world size; ZeRO-2 splits gradients and optimizer state (12) but keeps the weights (4);
  ZeRO-1 splits only the optimizer state (8).

Activations are not included: they depend on the batch and are the caller's margin, which
is why we warn above 80% of the budget and only refuse above 100%.
"""

from __future__ import annotations

import logging
import math
import re
import warnings
from dataclasses import dataclass
from typing import Any

from michelangelo.errors import InputError
from michelangelo.lib.trainer.torch.pytorch_lightning._lightning import classes

logger = logging.getLogger(__name__)

BYTES_PER_PARAM = 16
WARN_FRACTION = 0.8

__all__ = [
    "DeferredMemoryCheck",
    "MemoryEstimate",
    "build_meta_model",
    "cannot_build_here",
    "check_memory",
    "count_meta_parameters",
    "estimate_bytes",
]


@dataclass(frozen=True)
class MemoryEstimate:
    """Per-worker persistent bytes against the budget they must fit in."""

    parameters: int
    per_worker_bytes: int
    budget_bytes: int
    budget_source: str

    @property
    def fraction(self) -> float:
        return self.per_worker_bytes / self.budget_bytes


def build_meta_model(create_model_fn: Any, kwargs: dict[str, Any], configure: bool = True
                     ) -> Any | None:
    """``create_model_fn(**kwargs)`` on the meta device, or None when it cannot be built so.

    With ``configure`` the model's ``configure_model()`` runs too (the whole model as it trains;
    layers created or wrapped there included); without it, the model as the factory returns it.

    Failures that come from building on the meta device or on the driver (see
    :func:`cannot_build_here`) skip the preflight with a DEBUG log; any other exception from
    the factory is its own bug or a bad argument, which every worker would hit too. An
    exception from ``configure_model()`` never fails the driver: the hook may use what only
    the distributed run has (``self.device_mesh``, ``self.trainer``, a process group), so the
    build is skipped with a DEBUG log and the decisions it fed move to the workers, where an
    error in the hook names it (see ``_warm_start._model_stages.run_after_configure``).

    Raises:
        ValueError: The factory raised for another reason, or returned something that is not a
            ``LightningModule`` of either package; the original exception is chained.
    """
    import torch

    try:
        with torch.device("meta"):
            model = create_model_fn(**kwargs)
    except Exception as error:  # noqa: BLE001 - sorted below: skip or surface
        if not cannot_build_here(error):
            name = getattr(create_model_fn, "__qualname__", repr(create_model_fn))
            raise InputError(
                f"create_model_fn {name}(**create_model_fn_kwargs) raised "
                f"{type(error).__name__}: {error} when the driver built it on the meta device "
                "(no memory, no weights) for the memory preflight; every worker would fail the "
                "same way. Fix: correct the factory or create_model_fn_kwargs (the traceback "
                "above shows where it failed)."
            ) from error
        logger.debug("Memory preflight skipped: create_model_fn cannot build on the meta "
                     "device here (%s: %s)", type(error).__name__, error)
        return None
    if not isinstance(model, classes("LightningModule")):
        raise InputError(
            f"create_model_fn returned {type(model).__name__}, not a LightningModule. Fix: "
            "return a pytorch_lightning.LightningModule or a lightning.pytorch.LightningModule "
            "(import lightning as L; class Model(L.LightningModule))."
        )
    if configure and callable(getattr(model, "configure_model", None)):
        try:
            with torch.device("meta"):
                model.configure_model()
        except Exception as error:  # noqa: BLE001 - the workers run the hook for real
            logger.debug(
                "%s.configure_model() did not run on the driver (%s: %s); it may need the "
                "distributed run (device_mesh, trainer, process group). The memory estimate "
                "and warm-start/freeze stage of the configured model are decided on the "
                "workers.", type(model).__name__, type(error).__name__, error)
            return None
    return model


# torch's words for an operation the meta device cannot do (reading data out of a meta
# tensor, an op without a meta kernel), and for GPU-only code on a CPU-only driver.
_DEVICE_WORDS = re.compile(r"\b(meta|cuda|nvidia|gpu)\b", re.IGNORECASE)


def cannot_build_here(error: BaseException) -> bool:
    """Whether ``error`` means "not buildable on the driver's meta device", not a bug.

    True for files, network or packages only the workers have (``OSError``,
    ``ImportError``), for ops torch did not implement on meta (``NotImplementedError``), and
    for errors whose message, or a chained cause's, speaks of the meta device or a GPU.
    """
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError | ImportError | NotImplementedError):
            return True
        if _DEVICE_WORDS.search(str(current)):
            return True
        current = current.__cause__ or current.__context__
    return False


def count_meta_parameters(model: Any) -> int:
    """Unique parameter elements of ``model`` (tied weights counted once)."""
    seen: set[int] = set()
    total = 0
    for param in model.parameters():
        if id(param) in seen:
            continue
        seen.add(id(param))
        total += param.numel()
    return total


def estimate_bytes(parameters: int, strategy: Any, world_size: int) -> int:
    """Persistent per-worker bytes for ``parameters`` under ``strategy`` (a StrategyChoice)."""
    world = max(world_size, 1)
    if strategy.shards_parameters:
        return math.ceil(parameters * BYTES_PER_PARAM / world)
    if strategy.name == "deepspeed":
        stage = int(strategy.kwargs.get("stage", 2))
        replicated = {0: 16, 1: 8, 2: 4, 3: 0}.get(stage, 4)
        return math.ceil(parameters * (replicated + (BYTES_PER_PARAM - replicated) / world))
    return parameters * BYTES_PER_PARAM


def worker_budget(scaling_config: Any) -> tuple[int, str] | None:
    """Bytes one worker may use, and where that number came from; None when unknown."""
    if scaling_config.use_gpu:
        import torch

        if torch.cuda.is_available():
            total = torch.cuda.get_device_properties(0).total_memory
            return int(total), "GPU memory (torch.cuda device 0 on the driver)"
        return None
    per_worker = (scaling_config.resources_per_worker or {}).get("memory")
    if per_worker:
        return int(per_worker), "ScalingConfig.resources_per_worker['memory']"
    from michelangelo.uniflow.plugins.ray import current_ray_task

    task = current_ray_task()
    if task is None or task.parsed("worker_memory") is None:
        return None
    workers = _workers(scaling_config)
    # Workers spread over the worker nodes; those sharing a node share its memory.
    per_node = math.ceil(max(workers, 1) / max(task.worker_instances, 1))
    budget = int(task.parsed("worker_memory")) // per_node
    return budget, f"RayTask worker_memory / {per_node} worker(s) per node"


def _judge(parameters: int, strategy: Any, workers: int, budget: tuple[int, str]
           ) -> MemoryEstimate:
    estimate = MemoryEstimate(
        parameters, estimate_bytes(parameters, strategy, workers), budget[0], budget[1]
    )
    text = (
        f"{parameters:,} parameters x {BYTES_PER_PARAM} bytes (weights, gradients, AdamW "
        f"state) under strategy={strategy.label!r} over {workers} worker(s) is about "
        f"{estimate.per_worker_bytes / 2**30:.2f} GiB per worker before activations, "
        f"{estimate.fraction:.0%} of {budget[0] / 2**30:.2f} GiB ({budget[1]})"
    )
    if estimate.fraction > 1.0:
        raise InputError(
            f"Memory preflight: {text}. Fix: raise worker_memory (or the GPU), add workers "
            "with a sharding strategy ('fsdp', 'fsdp2' or 'deepspeed'), or shrink the model."
        )
    if estimate.fraction > WARN_FRACTION:
        warnings.warn(f"Memory preflight: {text}; little room is left for activations. "
                      "Consider a sharding strategy or more memory.", UserWarning, stacklevel=4)
    return estimate


def _workers(scaling_config: Any) -> int:
    workers = scaling_config.num_workers
    return workers[1] if isinstance(workers, tuple) else workers


def check_memory(parameters: int, strategy: Any, scaling_config: Any) -> MemoryEstimate | None:
    """Warn above 80% of a worker's budget; raise above 100%.

    Raises:
        ValueError: The persistent state alone exceeds the budget.
    """
    budget = worker_budget(scaling_config)
    if budget is None:
        logger.debug("Memory preflight skipped: no per-worker memory is declared")
        return None
    return _judge(parameters, strategy, _workers(scaling_config), budget)


@dataclass(frozen=True)
class DeferredMemoryCheck:
    """The memory preflight, run on a worker once ``configure_model()`` built the model.

    Used when the driver could not run the hook (it needs the distributed run); the budget is
    still read on the driver, where the RayTask and ScalingConfig are known.
    """

    strategy: Any
    workers: int
    budget_bytes: int
    budget_source: str

    @classmethod
    def plan(cls, strategy: Any, scaling_config: Any) -> DeferredMemoryCheck | None:
        """The check to run on the workers, or None when no per-worker memory is declared."""
        budget = worker_budget(scaling_config)
        if budget is None:
            return None
        return cls(strategy, _workers(scaling_config), budget[0], budget[1])

    def run(self, model: Any) -> MemoryEstimate:
        """Judge ``model`` as configured (FSDP2 ``DTensor`` shards count at their full size).

        Raises:
            ValueError: The persistent state alone exceeds the budget.
        """
        estimate = _judge(count_meta_parameters(model), self.strategy, self.workers,
                          (self.budget_bytes, self.budget_source))
        logger.info("Memory preflight (on the worker, after configure_model()): %s "
                    "parameters, %.0f%% of the budget", f"{estimate.parameters:,}",
                    100 * estimate.fraction)
        return estimate
