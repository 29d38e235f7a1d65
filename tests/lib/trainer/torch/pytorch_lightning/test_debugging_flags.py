"""The practice's debugging flags, each through LightningTrainer, in both Lightning packages.

``lightning-in-depth`` lists them in the order to use them before a long run:
``fast_dev_run``, ``overfit_batches``, ``limit_train_batches``/``limit_val_batches``, the
profilers, ``detect_anomaly``, and the sanity check (``num_sanity_val_steps``). The modules are
written as each package's docs write one; the ``lightning`` cases run where that package is
installed (``make test`` runs them with it beside the venv's ``pytorch_lightning``).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os

import pytest
import torch
from _models import SAME_IMPORTS_ENV, make_regression_datasets, ship_by_value
from ray.train import RunConfig, ScalingConfig
from torch import nn

from michelangelo.lib.trainer.torch.pytorch_lightning import (
    LightningTrainer,
    LightningTrainerParam,
)

ship_by_value(__name__)

pytestmark = pytest.mark.usefixtures("ray_cluster")
RAY_NUM_CPUS = 3
RAY_ENV_VARS = SAME_IMPORTS_ENV

_HAS_LIGHTNING = importlib.util.find_spec("lightning") is not None
PACKAGES = [
    "pytorch_lightning",
    pytest.param("lightning.pytorch", marks=[
        pytest.mark.lightning_packages,
        pytest.mark.skipif(not _HAS_LIGHTNING, reason="the lightning package is not installed")]),
]


def regressor_class(package: str) -> type:
    """The same small module, built on ``package``, as its docs write one."""
    pl = importlib.import_module(package)

    class Regressor(pl.LightningModule):
        def __init__(self, record_dir: str, lr: float = 0.05, nan_at_step: int = -1):
            super().__init__()
            self.save_hyperparameters()
            self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))

        def training_step(self, batch, batch_idx):
            prediction = self.net(batch["x"]).squeeze(-1)
            if self.global_step == self.hparams.nan_at_step:
                # The classic bug detect_anomaly finds: a finite forward pass whose backward
                # is NaN (sqrt's gradient at the negative values where() does not select).
                prediction = torch.where(prediction > 0, torch.sqrt(prediction), prediction)
            loss = nn.functional.mse_loss(prediction, batch["y"])
            self.log("train/loss", loss, sync_dist=True)
            return loss

        def validation_step(self, batch, batch_idx):
            loss = nn.functional.mse_loss(self.net(batch["x"]).squeeze(-1), batch["y"])
            self.log("val/loss", loss, sync_dist=True)

        def on_validation_epoch_start(self):
            if self.trainer.sanity_checking:
                record(self, "sanity", {"batches": self.trainer.num_sanity_val_steps})

        def on_train_end(self):
            record(self, "train_end", {
                "global_step": self.global_step,
                "num_training_batches": self.trainer.num_training_batches,
                "num_val_batches": list(self.trainer.num_val_batches),
                "losses": getattr(self, "_losses", []),
                "first_rows": getattr(self, "_firsts", []),
            })

        def on_train_batch_end(self, outputs, batch, batch_idx):
            self._losses = [*getattr(self, "_losses", []), float(outputs["loss"])]
            self._firsts = [*getattr(self, "_firsts", []), batch["x"][0].tolist()]

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)

    Regressor.__qualname__ = f"Regressor[{package}]"
    return Regressor


def record(module, event: str, values: dict) -> None:
    path = os.path.join(module.hparams.record_dir, f"rank{module.global_rank}-{event}.json")
    with open(path, "w") as handle:
        json.dump(values, handle)


def read(record_dir, event: str) -> list[dict]:
    return [json.loads((record_dir / f"rank{r}-{event}.json").read_text()) for r in (0, 1)]


def run(tmp_path, package, name, kwargs, train_rows=64, val_rows=16, **model_kwargs):
    records = tmp_path / "records"
    records.mkdir(exist_ok=True)
    train, val = make_regression_datasets(train_rows, val_rows)
    trainer = LightningTrainer(
        trainer_param=LightningTrainerParam(
            create_model_fn=regressor_class(package),
            create_model_fn_kwargs={"record_dir": str(records), **model_kwargs},
            train_data=train, val_data=val, batch_size=8, lightning_trainer_kwargs=kwargs),
        run_config=RunConfig(name=name, storage_path=str(tmp_path / "ray")),
        scaling_config=ScalingConfig(num_workers=2),
    )
    return trainer, records


@pytest.mark.parametrize("package", PACKAGES)
def test_fast_dev_run_returns_its_metrics_and_says_no_checkpoint_was_written(tmp_path, package):
    pl = importlib.import_module(package)
    trainer, records = run(tmp_path, package, "fast-dev", {
        "fast_dev_run": True, "max_epochs": 5,
        "callbacks": [pl.callbacks.ModelCheckpoint(monitor="val/loss")]})
    with pytest.warns(UserWarning, match=r"fast_dev_run'\]=True.*no checkpoint.*checkpoint_path "
                                         r"is None.*Fix: remove fast_dev_run"):
        result = trainer.train()
    assert result["checkpoint_path"] is None
    assert {"train/loss", "val/loss"} <= set(result["metrics"])
    for rank in read(records, "train_end"):
        assert rank["global_step"] == 1  # one batch through every hook
        assert rank["num_training_batches"] == 1 and rank["num_val_batches"] == [1]


@pytest.mark.parametrize("package", PACKAGES)
def test_overfit_batches_trains_on_the_same_batches_and_the_loss_falls(tmp_path, package):
    trainer, records = run(tmp_path, package, "overfit", {
        "overfit_batches": 2, "max_epochs": 15, "num_sanity_val_steps": 2, "profiler": "simple"})
    result = trainer.train()
    for rank in read(records, "train_end"):
        assert rank["num_training_batches"] == 2
        assert rank["global_step"] == 30
        firsts = rank["first_rows"]
        assert all(firsts[i] == firsts[i % 2] for i in range(len(firsts))), firsts[:4]
        losses = rank["losses"]
        # The same two batches every epoch: the curve of each falls towards zero.
        assert losses[-2] < 0.2 * losses[0] and losses[-1] < 0.2 * losses[1], losses
    # The sanity check ran its batches before training.
    assert [r["batches"] for r in read(records, "sanity")] == [2, 2]
    # Each rank's profiler report is kept under the run.
    profiled = tmp_path / "ray" / "overfit" / "profiler"
    for rank in (0, 1):
        reports = list((profiled / f"rank-{rank}").glob("*.txt"))
        assert reports, sorted(p.name for p in profiled.rglob("*"))
        text = "\n".join(p.read_text() for p in reports)
        assert "run_training_epoch" in text and "[Strategy]" in text
    assert result["checkpoint_path"]


@pytest.mark.parametrize("package", PACKAGES)
def test_limit_batches_shorten_epochs_and_the_pytorch_profiler_traces(tmp_path, package):
    trainer, records = run(tmp_path, package, "limited", {
        "limit_train_batches": 2, "limit_val_batches": 1, "max_epochs": 2,
        "profiler": "pytorch"}, train_rows=128, val_rows=32)
    trainer.train()
    for rank in read(records, "train_end"):
        assert rank["num_training_batches"] == 2 and rank["num_val_batches"] == [1]
        assert rank["global_step"] == 4
    profiled = tmp_path / "ray" / "limited" / "profiler"
    for rank in (0, 1):
        files = [p.name for p in (profiled / f"rank-{rank}").rglob("*") if p.is_file()]
        assert any(name.endswith(".txt") for name in files), files


@pytest.mark.parametrize("package", PACKAGES)
def test_detect_anomaly_names_the_operation_that_made_the_first_nan(tmp_path, package):
    trainer, _ = run(tmp_path, package, "anomaly", {"detect_anomaly": True, "max_epochs": 1},
                     nan_at_step=1)
    with pytest.raises(Exception) as failed:
        trainer.train()
    message = str(failed.value)
    assert "SqrtBackward0" in message, message[-3000:]
    assert "returned nan values" in message
