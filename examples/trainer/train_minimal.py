"""The trainer guide's minimal training task, as a uniflow workflow that runs on a laptop.

Run it with ``python examples/trainer/train_minimal.py``. ``prepare`` builds two small
Ray datasets and hands them on as ``DatasetVariable`` handles; ``train`` is the guide's task:
it runs on a RayTask cluster, and ``LightningTrainer`` trains on 2 Ray Train workers there.
Differences from the guide (resources only): a smaller cluster, 2 CPU workers instead of
4 GPU workers, and ``precision="bf16-mixed"`` because fp16 needs a GPU (the trainer refuses
``"16-mixed"`` with ``use_gpu=False`` on the driver, naming the fix).
"""

from __future__ import annotations

import numpy as np
import pytorch_lightning as pl
import ray
import ray.data
import torch
from ray.train import CheckpointConfig, ScalingConfig
from torch import nn

import michelangelo.uniflow.core as uniflow
from michelangelo.lib.trainer.torch.pytorch_lightning import (
    LightningTrainer,
    LightningTrainerParam,
)
from michelangelo.uniflow.plugins.ray import RayTask, create_run_config
from michelangelo.workflow.variables import DatasetVariable

FEATURES = 8


class MyLightningModule(pl.LightningModule):
    """An MLP regressor; logs ``val_loss`` synced across workers for checkpoint ranking."""

    def __init__(self, hidden_dim: int, learning_rate: float) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(FEATURES, hidden_dim), nn.ReLU(),
                                 nn.Linear(hidden_dim, 1))

    def _loss(self, batch) -> torch.Tensor:
        return nn.functional.mse_loss(self.net(batch["x"]).squeeze(-1), batch["y"])

    def training_step(self, batch, batch_idx):
        loss = self._loss(batch)
        self.log("train_loss", loss, sync_dist=True)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", self._loss(batch), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.learning_rate)


def create_model(hidden_dim: int, learning_rate: float) -> pl.LightningModule:
    """Runs on each worker; the model is built there and never pickled."""
    return MyLightningModule(hidden_dim=hidden_dim, learning_rate=learning_rate)


def make_dataset(n_rows: int, seed: int) -> ray.data.Dataset:
    rng = np.random.default_rng(seed)
    weights = np.linspace(-1, 1, FEATURES, dtype=np.float32)
    rows = []
    for _ in range(n_rows):
        x = rng.normal(size=FEATURES).astype(np.float32)
        rows.append({"x": x, "y": np.float32(x @ weights)})
    return ray.data.from_items(rows)


@uniflow.task(config=RayTask(head_cpu=1, worker_cpu=1, worker_instances=1))
def prepare(n_rows: int) -> tuple[DatasetVariable, DatasetVariable]:
    return (DatasetVariable.create(make_dataset(n_rows, 0)),
            DatasetVariable.create(make_dataset(n_rows // 4, 1)))


@uniflow.task(
    config=RayTask(
        head_cpu=1,
        head_memory="2Gi",
        worker_cpu=2,
        worker_memory="2Gi",
        worker_instances=2,
    )
)
def train(train_dv: DatasetVariable, val_dv: DatasetVariable):
    train_dv.load_ray_dataset()
    val_dv.load_ray_dataset()

    trainer = LightningTrainer(
        trainer_param=LightningTrainerParam(
            create_model_fn=create_model,
            create_model_fn_kwargs={"hidden_dim": 32, "learning_rate": 1e-2},
            train_data=train_dv.value,
            val_data=val_dv.value,
            batch_size=32,
            lightning_trainer_kwargs={
                "max_epochs": 2,
                "precision": "bf16-mixed",
                "log_every_n_steps": 2,
            },
        ),
        run_config=create_run_config(
            name="my-training-run",
            checkpoint_config=CheckpointConfig(
                num_to_keep=1,
                checkpoint_score_attribute="val_loss",
                checkpoint_score_order="min",
            ),
        ),
        scaling_config=ScalingConfig(
            num_workers=2,
            use_gpu=False,
            resources_per_worker={"CPU": 1},
        ),
    )

    result = trainer.train()
    return result["checkpoint_path"]


@uniflow.workflow()
def minimal(n_rows: int = 512) -> str:
    train_dv, val_dv = prepare(n_rows)
    return train(train_dv, val_dv)


if __name__ == "__main__":
    print("checkpoint:", uniflow.create_context().run(minimal))
