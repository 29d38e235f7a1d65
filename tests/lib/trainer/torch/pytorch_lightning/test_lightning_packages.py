"""Modules written with either Lightning package train, each under its own package's Trainer.

Lightning's documentation writes ``import lightning as L``; the guide writes ``import
pytorch_lightning as pl``. With both packages installed (``make test`` runs this module with
the ``lightning`` package on the path, beside the venv's ``pytorch_lightning``), each module
trains with callbacks and strategies of its own package, and a run that mixes them is refused
on the driver. Where ``lightning`` is not installed the module is skipped.
"""

from __future__ import annotations

import json
import os

import pytest
import pytorch_lightning as pl
import torch
from _models import ISOLATED_STATE_API, make_regression_datasets, ship_by_value
from ray.train import RunConfig, ScalingConfig
from torch import nn

from michelangelo.lib.trainer.torch.pytorch_lightning import (
    LightningTrainer,
    LightningTrainerParam,
)

L = pytest.importorskip("lightning")

ship_by_value(__name__)

pytestmark = [pytest.mark.lightning_packages, pytest.mark.usefixtures("ray_cluster")]
RAY_NUM_CPUS = 3
# The workers import what this process imports: the `lightning` package beside the venv.
RAY_ENV_VARS = {"PYTHONPATH": os.pathsep.join(
    os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p),
    **ISOLATED_STATE_API}


class LitRegressor(L.LightningModule):
    """As Lightning's docs write a module: ``import lightning as L``."""

    def __init__(self, record_dir: str, lr: float = 0.05):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))

    def training_step(self, batch, batch_idx):
        loss = nn.functional.mse_loss(self.net(batch["x"]).squeeze(-1), batch["y"])
        self.log("train/loss", loss, sync_dist=True)
        return loss

    def validation_step(self, batch, batch_idx):
        loss = nn.functional.mse_loss(self.net(batch["x"]).squeeze(-1), batch["y"])
        self.log("val/loss", loss, sync_dist=True)

    def on_fit_start(self):
        record_classes(self)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


class PlRegressor(pl.LightningModule):
    """The guide's way: ``import pytorch_lightning as pl``."""

    def __init__(self, record_dir: str, lr: float = 0.05):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))

    def training_step(self, batch, batch_idx):
        loss = nn.functional.mse_loss(self.net(batch["x"]).squeeze(-1), batch["y"])
        self.log("train/loss", loss, sync_dist=True)
        return loss

    def validation_step(self, batch, batch_idx):
        loss = nn.functional.mse_loss(self.net(batch["x"]).squeeze(-1), batch["y"])
        self.log("val/loss", loss, sync_dist=True)

    def on_fit_start(self):
        record_classes(self)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


def record_classes(module) -> None:
    """What the worker's Trainer and strategy were built on, for the test to read back."""
    record = {"trainer": type(module.trainer).__module__,
              "strategy": [c.__module__ for c in type(module.trainer.strategy).__mro__]}
    path = os.path.join(module.hparams.record_dir, f"rank{module.global_rank}.json")
    with open(path, "w") as handle:
        json.dump(record, handle)


CASES = {
    "lightning": (LitRegressor, L.pytorch.callbacks.ModelCheckpoint, "lightning.pytorch"),
    "pytorch_lightning": (PlRegressor, pl.callbacks.ModelCheckpoint, "pytorch_lightning"),
}


@pytest.mark.parametrize("package", sorted(CASES))
def test_each_package_trains_under_its_own_trainer(tmp_path, package):
    factory, model_checkpoint, expected = CASES[package]
    records = tmp_path / "records"
    records.mkdir()
    train, val = make_regression_datasets(64, 16)
    kwargs = {"max_epochs": 2, "strategy": "ddp",
              "callbacks": [model_checkpoint(monitor="val/loss", mode="min", save_top_k=1)]}
    result = LightningTrainer(
        trainer_param=LightningTrainerParam(
            create_model_fn=factory, create_model_fn_kwargs={"record_dir": str(records)},
            train_data=train, val_data=val, lightning_trainer_kwargs=kwargs),
        run_config=RunConfig(name=package, storage_path=str(tmp_path / "ray")),
        scaling_config=ScalingConfig(num_workers=2),
    ).train()

    assert {"train/loss", "val/loss"} <= set(result["metrics"])
    assert result["checkpoint_path"]
    for rank in (0, 1):
        record = json.loads((records / f"rank{rank}.json").read_text())
        assert record["trainer"].startswith(expected), record
        assert any(name.startswith(f"{expected}.strategies") for name in record["strategy"])


def test_a_mix_of_the_two_packages_is_refused_on_the_driver(tmp_path):
    train, val = make_regression_datasets(16, 8)
    with pytest.raises(ValueError) as refused:
        LightningTrainer(
            trainer_param=LightningTrainerParam(
                create_model_fn=LitRegressor,
                create_model_fn_kwargs={"record_dir": str(tmp_path)},
                train_data=train, val_data=val,
                lightning_trainer_kwargs={"callbacks": [pl.callbacks.ModelCheckpoint()]}),
            scaling_config=ScalingConfig(num_workers=2),
        )
    message = str(refused.value)
    assert "lightning_trainer_kwargs['callbacks'][0]" in message
    assert "is a pytorch_lightning object" in message
    assert "is built on lightning.pytorch" in message
    assert "Fix: import it from lightning.pytorch" in message
