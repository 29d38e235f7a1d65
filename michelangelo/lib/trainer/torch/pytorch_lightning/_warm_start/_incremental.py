"""``IncrementalTrainingSpec``: continue training a registered revision.

The revision's weights are loaded into the fresh model on every worker (read once on rank 0),
and, with ``load_optimizer_weights=True``, its optimizer and LR scheduler states too (a
scheduler whose state could not be stored without a pickle starts afresh, with a warning).
The loop's position is
set at the start of training: the epoch counter starts at the revision's completed epochs
(or ``override_incremental_training_epoch``) and the global step at the revision's, so
``max_epochs`` keeps meaning the total epoch count, as it does on a resume. When Ray resumes
the run from its own checkpoint, that checkpoint wins and nothing here is applied again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from michelangelo.errors import InputError
from michelangelo.lib.checkpoints import (
    ModelSpec,
    align_state_dict_keys,
)
from michelangelo.lib.trainer.torch.pytorch_lightning._config import (
    IncrementalTrainingSpec,
)
from michelangelo.lib.trainer.torch.pytorch_lightning._lightning import Callback, classes
from michelangelo.lib.trainer.torch.pytorch_lightning._warm_start._inherit import read_baseline
from michelangelo.lib.trainer.torch.pytorch_lightning._warm_start._model_stages import (
    BEFORE,
    MetaModels,
    first_stage_that_fits,
)
from michelangelo.lib.trainer.torch.pytorch_lightning._warm_start._weights import (
    copy_into,
    read_on_rank0,
)

logger = logging.getLogger(__name__)

__all__ = ["IncrementalPlan", "check_revision_fits", "incremental_callback", "load_revision",
           "plan_incremental", "read_revision"]


@dataclass(frozen=True)
class IncrementalPlan:
    """The revision to continue from and where the loop starts, decided on the driver."""

    registry_url: str
    baseline: ModelSpec
    load_optimizer: bool
    start_epoch: int
    global_step: int
    # When the weights are loaded on a worker (``_model_stages.BEFORE`` or ``AFTER``); None
    # when the driver could not tell (the workers decide from the model they build).
    stage: str | None = BEFORE


def _single_copy_optimizer(strategy: Any) -> bool:
    # Optimizer state is restored whole on every rank, which only fits strategies that keep
    # a full optimizer per worker.
    if strategy.instance is None:
        return strategy.name in (None, "ddp")
    return isinstance(strategy.instance, classes("strategies.DDPStrategy")) and not isinstance(
        strategy.instance, classes("strategies.DeepSpeedStrategy"))


def _check_fit(model: Any, stored_shapes: dict[str, tuple[int, ...]], name: str) -> None:
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    stored, _ = align_state_dict_keys(stored_shapes, shapes.keys())
    missing = [k for k in shapes if k not in stored]
    wrong = [f"{k}: model {list(shapes[k])} vs revision {list(stored[k])}"
             for k in shapes if k in stored and tuple(stored[k]) != shapes[k]]
    if missing or wrong or not shapes:
        raise InputError(
            f"IncrementalTrainingSpec: revision {name} does not fit the model "
            f"(missing tensors {missing[:5]}, different shapes {wrong[:5]}); incremental "
            "training continues the same model. Fix: use the create_model_fn (and kwargs) "
            "the revision was trained with, or TransferLearningSpec to inherit some layers.")


def plan_incremental(spec: IncrementalTrainingSpec | None, models: MetaModels, registry: Any,
                     resolved: Any) -> IncrementalPlan | None:
    """Check the incremental run against the registry and the model, on the driver.

    Raises:
        ValueError: No baseline, an unknown revision, a revision without optimizer state when
            it is asked for, a sharded strategy with optimizer state, weights that do not fit
            the model, or ``max_epochs`` not beyond the starting epoch.
    """
    if spec is None:
        return None
    baseline = spec.metadata.baseline_model if spec.metadata is not None else None
    if baseline is None:
        raise InputError(
            "IncrementalTrainingSpec needs metadata.baseline_model, the registered revision to "
            "continue. Fix: IncrementalTrainingSpec(metadata=TransferLearningMetadata("
            "learning_mode=LearningMode.INCREMENTAL_TRAINING, baseline_model=ModelSpec("
            "'project', 'model', '@champion'))).")
    target = registry.resolve(baseline)
    revision = registry.get(target)
    kept = revision.optimizer_state or {}
    if spec.load_optimizer_weights:
        if not kept:
            raise InputError(
                f"IncrementalTrainingSpec.load_optimizer_weights=True, but revision "
                f"{revision.name} kept no optimizer state. Fix: register the run's checkpoint "
                "with keep_optimizer_state=True, or set load_optimizer_weights=False.")
        if not _single_copy_optimizer(resolved.strategy):
            raise InputError(
                f"IncrementalTrainingSpec.load_optimizer_weights=True needs strategy 'ddp' "
                f"(a whole optimizer per worker), got {resolved.strategy.name!r}. Fix: use "
                "'ddp', or set load_optimizer_weights=False.")
    stored_shapes = registry.weights_shapes(target)
    fits = first_stage_that_fits(models,
                                 lambda model: _check_fit(model, stored_shapes, revision.name))
    stage = fits[0] if fits is not None else None
    override = spec.override_incremental_training_epoch
    start = override if override is not None else int(kept.get("epoch", 0))
    max_epochs = resolved.trainer_kwargs.get("max_epochs")
    if max_epochs is not None and max_epochs != -1 and start >= max_epochs:
        raise InputError(
            f"IncrementalTrainingSpec starts at epoch {start} (revision {revision.name}"
            f"{' ended there' if override is None else ', override_incremental_training_epoch'}"
            f") but lightning_trainer_kwargs['max_epochs']={max_epochs} counts all epochs, "
            f"so nothing would train. Fix: set max_epochs above {start} (e.g. {start + 1}), "
            "or override_incremental_training_epoch=0 to count epochs from zero.")
    logger.info("IncrementalTrainingSpec: continuing %s from epoch %d, global step %d%s",
                revision.name, start, int(kept.get("global_step", 0)),
                " with its optimizer state" if spec.load_optimizer_weights else "")
    return IncrementalPlan(registry.url, target, spec.load_optimizer_weights, start,
                           int(kept.get("global_step", 0)), stage)


def _restore_schedulers(trainer: Any, states: list[Any] | None) -> None:
    configs = trainer.lr_scheduler_configs
    if states is None:
        if configs:
            logger.warning("IncrementalTrainingSpec: the revision kept no LR scheduler state; "
                           "the schedule starts afresh.")
        return
    if len(states) != len(configs):
        raise InputError(
            f"IncrementalTrainingSpec: revision has {len(states)} LR scheduler state(s), "
            f"configure_optimizers() made {len(configs)}. Fix: keep configure_optimizers "
            "unchanged or set load_optimizer_weights=False.")
    for config, state in zip(configs, states, strict=True):
        config.scheduler.load_state_dict(state)


def _loop_position_callback(plan: IncrementalPlan, optimizer_states: list[Any] | None,
                            scheduler_states: list[Any] | None = None) -> Any:
    class IncrementalStart(Callback):
        """Sets the loop position, optimizer and scheduler state once the optimizers exist."""

        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            if trainer.ckpt_path is not None:
                return  # resumed from Ray's checkpoint: it already holds all of this
            if optimizer_states is not None:
                if len(optimizer_states) != len(trainer.optimizers):
                    raise InputError(
                        f"IncrementalTrainingSpec: revision has {len(optimizer_states)} "
                        f"optimizer state(s), configure_optimizers() made "
                        f"{len(trainer.optimizers)}. Fix: keep configure_optimizers unchanged "
                        "or set load_optimizer_weights=False.")
                for optimizer, state in zip(trainer.optimizers, optimizer_states, strict=True):
                    optimizer.load_state_dict(state)
                _restore_schedulers(trainer, scheduler_states)
            progress = trainer.fit_loop.epoch_progress
            for counter in (progress.current, progress.total):
                counter.ready = counter.started = counter.processed = plan.start_epoch
                counter.completed = plan.start_epoch
            epoch_loop = trainer.fit_loop.epoch_loop
            step = epoch_loop.automatic_optimization.optim_progress.optimizer.step.total
            step.ready = step.completed = plan.global_step
            epoch_loop.manual_optimization.optim_step_progress.total.ready = plan.global_step
            epoch_loop.manual_optimization.optim_step_progress.total.completed = plan.global_step
            epoch_loop._batches_that_stepped = plan.global_step

    return IncrementalStart()


def read_revision(plan: IncrementalPlan, rank: int, world_size: int) -> dict[str, Any]:
    """The revision's weights, read on rank 0 and broadcast."""
    return read_baseline(plan.registry_url, plan.baseline, rank, world_size,
                         "IncrementalTrainingSpec")


def check_revision_fits(model: Any, weights: dict[str, Any]) -> None:
    """Raise ValueError unless every tensor of ``model`` is in ``weights`` with its shape."""
    _check_fit(model, {k: tuple(v.shape) for k, v in weights.items()}, "(as read)")


def load_revision(model: Any, weights: dict[str, Any]) -> None:
    """Copy every tensor of the model from the revision (plain tensors or FSDP2 shards)."""
    import torch

    own = model.state_dict()
    aligned, _ = align_state_dict_keys(weights, own.keys())
    missing = [k for k in own if k not in aligned]
    if missing or not own:
        raise InputError(f"IncrementalTrainingSpec: the revision lacks the model's tensors "
                         f"{missing[:5] or '(the model has none yet)'}.")
    with torch.no_grad():
        for key, tensor in own.items():
            copy_into(tensor, aligned[key])


def incremental_callback(plan: IncrementalPlan | None, rank: int, world_size: int) -> Any:
    """The callback that sets the loop position (and optimizer state) at the start of fit.

    Returns:
        A Lightning callback to add to the trainer, or None without a plan.
    """
    if plan is None:
        return None
    states = None
    if plan.load_optimizer:
        from michelangelo.lib.model_registry import ModelRegistry

        def read() -> tuple[Any, Any]:
            kept = ModelRegistry(plan.registry_url).load_training_state(plan.baseline)
            return kept.optimizer_states, kept.lr_scheduler_states

        status, value = read_on_rank0(read, rank, world_size)
        if status == "error":
            raise InputError(f"IncrementalTrainingSpec: optimizer state of the revision could "
                             f"not be read on rank 0: {value}")
        states, schedulers = value
        return _loop_position_callback(plan, states, schedulers)
    return _loop_position_callback(plan, states)
