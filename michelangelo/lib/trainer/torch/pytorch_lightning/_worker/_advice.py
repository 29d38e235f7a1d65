"""Warnings for the practice's quiet failure modes, given once by rank 0 as training starts.

``lightning-in-depth`` lists mistakes that cost a run without failing it. Those that only a
worker can see (its scheduler, its DataModule's loaders, its GPU) are checked here, once the
``Trainer`` has set everything up, and each gets one warning that names the fix:

- a learning-rate scheduler stepped per epoch (Lightning's default ``interval``) whose schedule
  is longer than the run's epochs, such as a warmup that never ends;
- a validation set that does not divide across the ranks, so Lightning's distributed sampler
  repeats samples and the validation metrics count them twice;
- ``precision="16-mixed"`` on a GPU that supports bf16.
"""

from __future__ import annotations

import functools
import logging
import math
import warnings
from typing import Any

from michelangelo.lib.trainer.torch.pytorch_lightning._lightning import Callback

logger = logging.getLogger(__name__)

__all__ = ["PracticeWarnings", "fp16_advice", "padded_validation_advice", "scheduler_advice"]

_FP16 = {"16-mixed", "16", "16-true"}


def _warn(message: str) -> None:
    warnings.warn(message, UserWarning, stacklevel=2)
    logger.warning(message)


def scheduler_horizon(scheduler: Any) -> tuple[int, str] | None:
    """How many ``step()`` calls ``scheduler``'s schedule spans, and what sets it, when a
    well-known scheduler says so; None when it cannot be read (a plain lambda)."""
    for attribute in ("T_max", "total_iters", "total_steps"):
        value = getattr(scheduler, attribute, None)
        if isinstance(value, int) and value > 0:
            return value, attribute
    milestones = getattr(scheduler, "_milestones", None)  # SequentialLR
    if milestones:
        return int(milestones[-1]), "milestones"
    for fn in getattr(scheduler, "lr_lambdas", None) or []:
        if isinstance(fn, functools.partial):  # e.g. transformers' get_*_schedule_with_warmup
            for keyword in ("num_training_steps", "num_warmup_steps"):
                value = fn.keywords.get(keyword)
                if isinstance(value, int) and value > 0:
                    return value, keyword
    return None


def scheduler_advice(configs: list[Any], max_epochs: int | None) -> list[str]:
    """Messages for the schedulers stepped per epoch whose schedule outlasts ``max_epochs``."""
    if not max_epochs or max_epochs < 0:
        return []
    messages = []
    for config in configs:
        if getattr(config, "interval", "epoch") != "epoch":
            continue
        horizon = scheduler_horizon(config.scheduler)
        if horizon is None or horizon[0] <= max_epochs:
            continue
        steps, source = horizon
        name = type(config.scheduler).__name__
        messages.append(
            f"The learning-rate scheduler {name} is stepped once per epoch (the default "
            f"interval 'epoch'), but its schedule spans {steps} steps ({source}) and this run "
            f"trains {max_epochs} epoch(s): when training ends it will have taken "
            f"{max_epochs} of its {steps} steps (a warmup of that length never ends). Fix: "
            "return {'optimizer': opt, 'lr_scheduler': {'scheduler': sched, 'interval': "
            "'step'}} from configure_optimizers, with the schedule sized by "
            "self.trainer.estimated_stepping_batches.")
    return messages


def padded_validation_advice(dataset_sizes: list[int], world_size: int) -> str | None:
    """The message for validation sets that do not divide across ``world_size`` ranks."""
    if world_size <= 1:
        return None
    padded = [(n, math.ceil(n / world_size) * world_size - n) for n in dataset_sizes]
    padded = [(n, extra) for n, extra in padded if extra]
    if not padded:
        return None
    sizes = ", ".join(f"{n} samples ({extra} repeated)" for n, extra in padded)
    return (
        f"The validation set ({sizes}) does not divide across the {world_size} ranks: "
        "Lightning's distributed sampler pads each rank to the same length by repeating "
        "samples, so the validation metrics count those twice. Fix: for exact metrics, make "
        f"the validation set a multiple of {world_size} samples, or validate on one device "
        "after training.")


def fp16_advice(precision: Any, bf16_supported: bool) -> str | None:
    """The line suggesting ``bf16-mixed`` where fp16 runs on a GPU that has bf16."""
    if str(precision) not in _FP16 or not bf16_supported:
        return None
    return (f"precision={precision!r} on a GPU that supports bf16: 'bf16-mixed' has fp32's "
            "range, needs no loss scaling and is as fast there. Fix: "
            "lightning_trainer_kwargs['precision']='bf16-mixed'.")


def _validation_sizes(trainer: Any) -> list[int]:
    loaders = trainer.val_dataloaders
    if loaders is None:
        return []
    loaders = loaders if isinstance(loaders, list | tuple) else [loaders]
    sizes = []
    for loader in loaders:
        sampler = getattr(loader, "sampler", None)
        dataset = getattr(loader, "dataset", None)
        # Only a loader Lightning gave a distributed sampler pads; the SDK's own batches of
        # Ray datasets split evenly (the driver says what that split leaves out).
        if type(sampler).__name__ not in ("DistributedSampler", "DistributedSamplerWrapper"):
            continue
        try:
            sizes.append(len(dataset))
        except TypeError:
            continue
    return sizes


class PracticeWarnings(Callback):
    """Rank 0's check of the run's set-up against the practice's failure modes."""

    def __init__(self) -> None:
        self._trained = False
        self._validated = False

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        # The validation loaders exist from the first validation (or sanity check) on.
        if self._validated or not trainer.is_global_zero:
            return
        self._validated = True
        message = padded_validation_advice(_validation_sizes(trainer), trainer.world_size)
        if message:
            _warn(message)

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if self._trained or not trainer.is_global_zero:
            return
        self._trained = True
        for message in scheduler_advice(trainer.lr_scheduler_configs, trainer.max_epochs):
            _warn(message)
        import torch

        if pl_module.device.type == "cuda":
            message = fp16_advice(trainer.precision, torch.cuda.is_bf16_supported())
            if message:
                _warn(message)
