"""The trainer guide's minimal training task, on CPU, as a plain script.

Run it with ``python examples/trainer/train_minimal.py``. It starts a small local Ray
instance, trains a tiny regressor on 2 Ray Train workers for 2 epochs and prints what
``train()`` returns. Differences from the guide's task: CPU workers (no ``use_gpu``),
``precision="bf16-mixed"`` instead of ``"16-mixed"`` (fp16 needs a GPU and is refused on the
driver), generated data instead of ``DatasetVariable``\\s, and small sizes.

Inside a uniflow workflow the function below becomes a task on its own cluster, e.g.::

    @uniflow.task(config=RayTask(head_cpu=2, head_memory="4Gi", worker_cpu=2,
                                 worker_memory="4Gi", worker_instances=2))
    def train(train_dv: DatasetVariable, val_dv: DatasetVariable): ...

and ``create_run_config`` then places the results with the run.
"""

from __future__ import annotations

import tempfile

import numpy as np
import pytorch_lightning as pl
import ray
import ray.data
import torch
from ray.train import CheckpointConfig, ScalingConfig
from torch import nn

from michelangelo.lib.trainer.torch.pytorch_lightning import (
    LightningTrainer,
    LightningTrainerParam,
)
from michelangelo.uniflow.plugins.ray import create_run_config

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


def train(train_ds: ray.data.Dataset, val_ds: ray.data.Dataset, storage_path: str) -> str:
    trainer = LightningTrainer(
        trainer_param=LightningTrainerParam(
            create_model_fn=create_model,
            create_model_fn_kwargs={"hidden_dim": 32, "learning_rate": 1e-2},
            train_data=train_ds,
            val_data=val_ds,
            batch_size=32,
            lightning_trainer_kwargs={
                "max_epochs": 2,
                "precision": "bf16-mixed",
                "log_every_n_steps": 2,
            },
        ),
        run_config=create_run_config(
            name="my-training-run",
            storage_path=storage_path,
            checkpoint_config=CheckpointConfig(
                num_to_keep=1,
                checkpoint_score_attribute="val_loss",
                checkpoint_score_order="min",
            ),
        ),
        scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1}),
    )
    result = trainer.train()
    print("metrics:", result["metrics"])
    print("result path:", result["path"])
    return result["checkpoint_path"]


if __name__ == "__main__":
    # address="local": always start a private instance, never join another one on this host.
    ray.init(address="local", num_cpus=2, include_dashboard=False, object_store_memory=200 * 2**20)
    try:
        with tempfile.TemporaryDirectory() as storage:
            path = train(make_dataset(512, 0), make_dataset(128, 1), storage)
            print("checkpoint:", path)
    finally:
        ray.shutdown()
