"""``IncrementalTrainingSpec``: continue a registered revision, optimizer state included.

The loop-position callback is checked in-process with a plain Lightning ``Trainer``; one
pair of real LightningTrainer runs (2 CPU workers on a local Ray) checks that the second run
continues the first one's epochs, steps and loss. Misconfigurations fail in the constructor.
"""

from __future__ import annotations

import pytest
import pytorch_lightning as pl
import torch
from _models import (
    TinyRegressor,
    create_seeded_model,
    create_tiny_model,
    regression_loader,
    regression_rows,
    ship_by_value,
)
from ray.train import RunConfig, ScalingConfig

from michelangelo.lib.checkpoints import CHECKPOINT_NAME
from michelangelo.lib.model_registry import ModelRegistry
from michelangelo.lib.trainer.torch.pytorch_lightning import (
    IncrementalTrainingSpec,
    LearningMode,
    LightningTrainer,
    LightningTrainerParam,
    ModelSpec,
    TransferLearningMetadata,
)
from michelangelo.lib.trainer.torch.pytorch_lightning._warm_start._incremental import (
    IncrementalPlan,
    incremental_callback,
    load_revision,
    read_revision,
)

ship_by_value(__name__)


RAY_NUM_CPUS = 3


def _spec(revision: int | str | None = 1, **kwargs) -> IncrementalTrainingSpec:
    return IncrementalTrainingSpec(
        metadata=TransferLearningMetadata(learning_mode=LearningMode.INCREMENTAL_TRAINING,
                                          baseline_model=ModelSpec("p", "m", revision)),
        **kwargs)


def _trainer(data, tmp_path, name, max_epochs, spec=None, **param) -> LightningTrainer:
    train, val = data
    kwargs = {"max_epochs": max_epochs, **param.pop("lightning", {})}
    factory = param.pop("factory", create_tiny_model)
    return LightningTrainer(
        trainer_param=LightningTrainerParam(
            create_model_fn=factory, create_model_fn_kwargs=param.pop("model", {}),
            train_data=train, val_data=val, batch_size=8, incremental_training_spec=spec,
            lightning_trainer_kwargs=kwargs, **param),
        run_config=RunConfig(name=name, storage_path=str(tmp_path / "ray")),
        scaling_config=ScalingConfig(num_workers=2),
    )


class _Seen(pl.Callback):
    def __init__(self) -> None:
        self.epochs: list[int] = []
        self.start_step = None
        self.start_state = None

    def on_train_start(self, trainer, pl_module):
        self.start_step = trainer.global_step
        self.start_state = {k: {n: t.clone() for n, t in v.items()}
                            for k, v in trainer.optimizers[0].state_dict()["state"].items()}

    def on_train_epoch_start(self, trainer, pl_module):
        self.epochs.append(trainer.current_epoch)


def _fit(model, max_epochs, callbacks):
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=max_epochs, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=callbacks)
    trainer.fit(model, regression_loader(32))
    return trainer


class _Scheduled(TinyRegressor):
    """Halves the learning rate every 3 optimizer steps."""

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)
        schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
        return {"optimizer": optimizer,
                "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


class _SeenSchedule(pl.Callback):
    def on_train_start(self, trainer, pl_module):
        scheduler = trainer.lr_scheduler_configs[0].scheduler
        self.last_epoch = scheduler.last_epoch
        self.lr = trainer.optimizers[0].param_groups[0]["lr"]


def test_lr_scheduler_state_continues_with_the_optimizer(tmp_path):
    torch.manual_seed(0)
    trainer = _fit(_Scheduled(), 2, [])  # 4 steps per epoch: the schedule is at step 8
    trainer.save_checkpoint(tmp_path / CHECKPOINT_NAME)
    registry = ModelRegistry(str(tmp_path / "r"))
    spec = registry.register("p", "m", checkpoint_path=str(tmp_path / CHECKPOINT_NAME),
                             keep_optimizer_state=True)
    assert registry.get(spec).optimizer_state["num_lr_schedulers"] == 1

    plan = IncrementalPlan(registry.url, spec, True, start_epoch=2, global_step=8)
    model, seen = _Scheduled(), _SeenSchedule()
    _fit(model, 3, [apply_incremental(model, plan, 0, 1), seen])
    assert seen.last_epoch == 8
    assert seen.lr == pytest.approx(0.1 * 0.5 ** (8 // 3))


def apply_incremental(model, plan, rank, world_size):
    """What a worker does: load the revision, then restore the loop with the callback."""
    load_revision(model, read_revision(plan, rank, world_size))
    return incremental_callback(plan, rank, world_size)


def test_loop_position_and_optimizer_state_are_restored(tmp_path):
    torch.manual_seed(0)
    first = create_tiny_model()
    trainer = _fit(first, 2, [])
    trainer.save_checkpoint(tmp_path / CHECKPOINT_NAME)
    registry = ModelRegistry(str(tmp_path / "r"))
    spec = registry.register("p", "m", checkpoint_path=str(tmp_path / CHECKPOINT_NAME),
                             keep_optimizer_state=True)
    saved = trainer.optimizers[0].state_dict()["state"]

    model = create_tiny_model()
    plan = IncrementalPlan(registry.url, spec, True, start_epoch=2, global_step=8)
    callback = apply_incremental(model, plan, rank=0, world_size=1)
    assert torch.equal(model.net[0].weight, first.net[0].weight)
    seen = _Seen()
    second = _fit(model, 3, [callback, seen])
    assert seen.epochs == [2]
    assert seen.start_step == 8 and second.global_step == 12
    for pid, entries in saved.items():
        for name, value in entries.items():
            assert torch.equal(seen.start_state[pid][name], value), (pid, name)

    # Without optimizer state, with an epoch override: counting restarts at the override.
    plan = IncrementalPlan(registry.url, spec, False, start_epoch=0, global_step=8)
    seen = _Seen()
    _fit(create_tiny_model(), 1, [apply_incremental(create_tiny_model(), plan, 0, 1), seen])
    assert seen.epochs == [0] and seen.start_state == {}


def test_driver_side_failures_before_any_worker(data, tmp_path):
    registry = ModelRegistry()
    registry.register("p", "m", state_dict=create_tiny_model().state_dict())
    weights_file = tmp_path / "weights.pt"
    torch.save(create_tiny_model().state_dict(), weights_file)
    cases = [
        (dict(spec=IncrementalTrainingSpec()), "needs metadata.baseline_model"),
        (dict(spec=_spec(load_optimizer_weights=True)), "kept no optimizer state"),
        (dict(spec=_spec(override_incremental_training_epoch=3)), r"max_epochs above 3"),
        (dict(spec=_spec(), model={"hidden_dim": 4}), r"different shapes.*net\.0\.weight"),
        (dict(spec=_spec(), initial_weights_path=str(weights_file)), "keep one of them"),
        (dict(spec=_spec(5)), "no revision 5"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            _trainer(data, tmp_path, "bad", 2, **kwargs)
    assert not (tmp_path / "ray").exists()


def test_fused_model_submodule_warns():
    with pytest.warns(UserWarning, match="fused_model_submodule='x' has no effect"):
        IncrementalTrainingSpec(fused_model_submodule="x")


def _val_loss(model: torch.nn.Module) -> float:
    rows = regression_rows(16, seed=1)
    x = torch.stack([torch.from_numpy(r["x"]) for r in rows])
    y = torch.tensor([float(r["y"]) for r in rows])
    with torch.no_grad():
        return float(torch.nn.functional.mse_loss(model.eval()(x), y))


def test_second_run_continues_the_registered_revision(data, tmp_path):
    # Every worker starts from the same seeded weights, so "the first run learnt something"
    # compares it with where it started, not with another random initialisation.
    first = _trainer(data, tmp_path, "first", 2, factory=create_seeded_model,
                     model={"seed": 0}).train()
    registry = ModelRegistry()
    spec = registry.register("p", "m", train_result=first, keep_optimizer_state=True,
                             create_model_fn=create_tiny_model)
    kept = registry.get(spec).optimizer_state
    assert kept["epoch"] == 2 and kept["global_step"] == first["metrics"]["step"]
    registry.set_alias("p", "m", "champion", spec.revision_id)

    second = _trainer(data, tmp_path, "second", 3,
                      _spec("@champion", load_optimizer_weights=True)).train()
    steps_per_epoch = first["metrics"]["step"] // 2
    assert second["metrics"]["epoch"] == 2
    assert second["metrics"]["step"] == first["metrics"]["step"] + steps_per_epoch
    start = _val_loss(create_seeded_model(seed=0))
    # Continued, not restarted: the loss picks up where the revision ended.
    assert second["metrics"]["val_loss"] < first["metrics"]["val_loss"] * 1.05
    assert first["metrics"]["val_loss"] < start
    assert _val_loss(registry.load_model(spec)) == pytest.approx(first["metrics"]["val_loss"],
                                                                 rel=1e-3)
