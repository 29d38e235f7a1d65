"""Training from a ``LightningDataModule``, written with ``import lightning as L``.

Run it with ``python examples/trainer/train_datamodule.py`` (needs ``michelangelo[trainer-lightning]``,
or the ``lightning`` package alone). Lightning's own documentation writes modules and data this
way: the DataModule writes its data set to disk once per node in ``prepare_data``, loads it on
every rank in ``setup`` and returns plain ``DataLoader`` objects. ``LightningTrainer`` builds it
on each Ray Train worker from ``create_datamodule_fn``, and Lightning's distributed sampler
gives each worker its own part of every epoch, reshuffled per epoch.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from ray.train import CheckpointConfig, ScalingConfig
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import michelangelo.uniflow.core as uniflow
from michelangelo.lib.trainer.torch.pytorch_lightning import (
    LightningTrainer,
    LightningTrainerParam,
)
from michelangelo.uniflow.plugins.ray import RayTask, create_run_config

FEATURES = 8


class SyntheticRegression(L.LightningDataModule):
    """A noisy linear target, generated once and kept as a ``.npz`` file in ``data_dir``."""

    def __init__(self, data_dir: str, rows: int = 1024, batch_size: int = 32):
        super().__init__()
        self.save_hyperparameters()

    @property
    def path(self) -> str:
        return os.path.join(self.hparams.data_dir, f"regression-{self.hparams.rows}.npz")

    def prepare_data(self):
        # Once per node: the place for downloads and anything written to disk.
        if os.path.exists(self.path):
            return
        os.makedirs(self.hparams.data_dir, exist_ok=True)
        rng = np.random.default_rng(0)
        x = rng.normal(size=(self.hparams.rows, FEATURES)).astype(np.float32)
        noise = 0.05 * rng.normal(size=self.hparams.rows)
        y = (x @ np.linspace(-1, 1, FEATURES) + noise).astype(np.float32)
        partial = self.path + ".partial"
        with open(partial, "wb") as handle:
            np.savez(handle, x=x, y=y)
        os.replace(partial, self.path)

    def setup(self, stage):
        # On every rank: read what prepare_data wrote, and split it.
        data = np.load(self.path)
        full = TensorDataset(torch.from_numpy(data["x"]), torch.from_numpy(data["y"]))
        n_val = len(full) // 5
        self.train_set, self.val_set = torch.utils.data.random_split(
            full, [len(full) - n_val, n_val], generator=torch.Generator().manual_seed(0))

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.hparams.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=self.hparams.batch_size)


class Regressor(L.LightningModule):
    def __init__(self, hidden_dim: int = 32, lr: float = 1e-2):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(FEATURES, hidden_dim), nn.ReLU(),
                                 nn.Linear(hidden_dim, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x).squeeze(-1), y)
        self.log("train/loss", loss, sync_dist=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val/loss", nn.functional.mse_loss(self.net(x).squeeze(-1), y), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)


@uniflow.task(config=RayTask(head_cpu=1, head_memory="2Gi", worker_cpu=2, worker_memory="2Gi",
                             worker_instances=1))
def train(data_dir: str, rows: int) -> dict:
    trainer = LightningTrainer(
        trainer_param=LightningTrainerParam(
            create_model_fn=Regressor,
            create_model_fn_kwargs={"hidden_dim": 32, "lr": 1e-2},
            create_datamodule_fn=SyntheticRegression,
            create_datamodule_fn_kwargs={"data_dir": data_dir, "rows": rows},
            lightning_trainer_kwargs={
                "max_epochs": 3,
                "log_every_n_steps": 4,
                "callbacks": [ModelCheckpoint(monitor="val/loss", mode="min", save_top_k=1)],
            },
        ),
        run_config=create_run_config(
            name="datamodule-run",
            checkpoint_config=CheckpointConfig(num_to_keep=1, checkpoint_score_attribute="val/loss",
                                               checkpoint_score_order="min"),
        ),
        scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1}),
    )
    result = trainer.train()
    metrics = result["metrics"]
    return {"checkpoint_path": result["checkpoint_path"], "val/loss": metrics["val/loss"],
            "step": metrics["step"], "global_batch_size": metrics["global_batch_size"]}


@uniflow.workflow()
def datamodule_training(data_dir: str, rows: int = 1024) -> dict:
    return train(data_dir, rows)


if __name__ == "__main__":
    where = sys.argv[1] if len(sys.argv) > 1 else os.path.join(tempfile.gettempdir(),
                                                                "michelangelo-example-data")
    print("result:", json.dumps(uniflow.create_context().run(datamodule_training,
                                                           data_dir=where)))
