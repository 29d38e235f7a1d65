"""Metric names with a ``/`` (``train/loss``, ``val/loss``), as the Lightning practice logs
them, work through the whole run: train()'s metrics, ModelCheckpoint's monitor, Ray Train's
checkpoint_score_attribute, and the kept checkpoint they choose."""

from __future__ import annotations

import json

import pytest
import pytorch_lightning as pl
import torch
from _models import make_regression_datasets, ship_by_value
from pytorch_lightning.callbacks import ModelCheckpoint
from ray.train import CheckpointConfig, Result, RunConfig, ScalingConfig
from torch import nn

from michelangelo.lib.trainer.torch.pytorch_lightning import (
    LightningTrainer,
    LightningTrainerParam,
)

ship_by_value(__name__)

pytestmark = pytest.mark.usefixtures("ray_cluster")


class SavedScores:
    """Appends each saved checkpoint's metrics, as rank 0 reports them, to a JSON-lines file."""

    def __init__(self, path: str) -> None:
        self.path = path

    def on_checkpoint_saved(self, epoch, step, metrics, checkpoint_path):
        import ray.train

        if ray.train.get_context().get_world_rank() == 0:
            with open(self.path, "a") as handle:
                handle.write(json.dumps({"epoch": epoch, "metrics": metrics}) + "\n")

    def on_result(self, metrics, checkpoint_path):
        pass


class Regressor(pl.LightningModule):
    def __init__(self, lr: float = 0.05):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))

    def training_step(self, batch, batch_idx):
        loss = nn.functional.mse_loss(self.net(batch["x"]).squeeze(-1), batch["y"])
        self.log("train/loss", loss, prog_bar=True, sync_dist=True)
        return loss

    def validation_step(self, batch, batch_idx):
        loss = nn.functional.mse_loss(self.net(batch["x"]).squeeze(-1), batch["y"])
        self.log("val/loss", loss, sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


def test_slashed_metric_names_reach_train_the_monitor_and_the_kept_checkpoint(tmp_path):
    train, val = make_regression_datasets(64, 16)
    result = LightningTrainer(
        trainer_param=LightningTrainerParam(
            create_model_fn=Regressor,
            create_model_fn_kwargs={"lr": 0.05},
            train_data=train,
            val_data=val,
            training_observer=SavedScores(str(tmp_path / "saved.jsonl")),
            lightning_trainer_kwargs={
                "max_epochs": 3,
                "callbacks": [ModelCheckpoint(monitor="val/loss", mode="min", save_top_k=2)],
            },
        ),
        run_config=RunConfig(
            name="slashed", storage_path=str(tmp_path / "ray"),
            checkpoint_config=CheckpointConfig(num_to_keep=2,
                                               checkpoint_score_attribute="val/loss",
                                               checkpoint_score_order="min"),
        ),
        scaling_config=ScalingConfig(num_workers=2),
    ).train()

    metrics = result["metrics"]
    assert {"train/loss", "val/loss"} <= set(metrics), sorted(metrics)
    with open(tmp_path / "saved.jsonl") as handle:
        saved = [json.loads(line) for line in handle]
    # ModelCheckpoint(monitor="val/loss") saved when val/loss improved, each with the score.
    assert saved and all("val/loss" in s["metrics"] for s in saved)
    # Ray Train kept the two lowest val/loss checkpoints of those it was given.
    kept = sorted(m["val/loss"] for _, m in Result.from_path(result["path"]).best_checkpoints)
    assert kept == sorted(s["metrics"]["val/loss"] for s in saved)[:2]
