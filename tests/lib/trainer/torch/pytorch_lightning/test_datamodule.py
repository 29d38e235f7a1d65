"""A ``LightningDataModule`` as the data source of a LightningTrainer run, on two workers.

The DataModule is written as Lightning's docs write one: ``prepare_data`` writes the data to
disk, ``setup`` loads it on every rank, the loaders are plain ``DataLoader``s with
``shuffle=True`` and no sampler. Lightning's distributed sampler then splits them by Ray's
ranks. A callback of the test's own records which rows each rank saw in each epoch.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import pytorch_lightning as pl
import torch
from _models import ISOLATED_STATE_API, ship_by_value
from pytorch_lightning.callbacks import Callback
from ray.train import RunConfig, ScalingConfig
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from michelangelo.lib.trainer.torch.pytorch_lightning import (
    LightningTrainer,
    LightningTrainerParam,
)

ship_by_value(__name__)

pytestmark = pytest.mark.usefixtures("ray_cluster")
RAY_NUM_CPUS = 3
RAY_ENV_VARS = dict(ISOLATED_STATE_API)

ROWS, VAL_ROWS, BATCH, EPOCHS = 48, 16, 4, 2


class IndexedRegression(pl.LightningDataModule):
    """Rows of a linear target, each with its index (so a test can see who read what)."""

    def __init__(self, data_dir: str, rows: int = ROWS, val_rows: int = VAL_ROWS,
                 batch_size: int = BATCH):
        super().__init__()
        self.save_hyperparameters()

    def prepare_data(self):
        # Once per node: write the data set to disk.
        rng = np.random.default_rng(0)
        x = rng.normal(size=(self.hparams.rows + self.hparams.val_rows, 8)).astype(np.float32)
        y = (x @ np.linspace(-1, 1, 8, dtype=np.float32)).astype(np.float32)
        np.savez(os.path.join(self.hparams.data_dir, "data.npz"), x=x, y=y)
        note(self.hparams.data_dir, "prepare_data", self.trainer)

    def setup(self, stage):
        # On every rank: load what prepare_data wrote.
        data = np.load(os.path.join(self.hparams.data_dir, "data.npz"))
        index = torch.arange(len(data["x"]))
        x, y = torch.from_numpy(data["x"]), torch.from_numpy(data["y"])
        n = self.hparams.rows
        self.train_set = TensorDataset(index[:n], x[:n], y[:n])
        self.val_set = TensorDataset(index[n:], x[n:], y[n:])
        note(self.hparams.data_dir, "setup", self.trainer)

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.hparams.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=self.hparams.batch_size)


class Regressor(pl.LightningModule):
    def __init__(self, lr: float = 0.05):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        _, x, y = batch
        loss = nn.functional.mse_loss(self.net(x).squeeze(-1), y)
        self.log("train/loss", loss, sync_dist=True)
        return loss

    def validation_step(self, batch, batch_idx):
        _, x, y = batch
        self.log("val/loss", nn.functional.mse_loss(self.net(x).squeeze(-1), y), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


def note(data_dir: str, hook: str, trainer) -> None:
    """One file per call of a DataModule hook, named by the rank that made it."""
    name = f"{hook}-rank{trainer.global_rank}-local{trainer.local_rank}-{os.getpid()}.json"
    with open(os.path.join(data_dir, name), "w") as handle:
        json.dump({"rank": trainer.global_rank}, handle)


class RecordRows(Callback):
    def __init__(self, record_dir: str):
        self.record_dir = record_dir
        self.rows: dict[int, list[int]] = {}
        self.val_rows: list[int] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.rows.setdefault(trainer.current_epoch, []).extend(batch[0].tolist())

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        if trainer.current_epoch == 0 and not trainer.sanity_checking:
            self.val_rows.extend(batch[0].tolist())

    def on_train_end(self, trainer, pl_module):
        record = {"rows": self.rows, "val_rows": self.val_rows,
                  "estimated_stepping_batches": trainer.estimated_stepping_batches,
                  "global_step": trainer.global_step}
        with open(os.path.join(self.record_dir, f"rank{trainer.global_rank}.json"), "w") as f:
            json.dump(record, f)


def test_a_datamodule_trains_sharded_by_ray_ranks(tmp_path):
    data_dir, records = tmp_path / "data", tmp_path / "records"
    data_dir.mkdir()
    records.mkdir()
    trainer = LightningTrainer(
        trainer_param=LightningTrainerParam(
            create_model_fn=Regressor, create_model_fn_kwargs={},
            create_datamodule_fn=IndexedRegression,
            create_datamodule_fn_kwargs={"data_dir": str(data_dir)},
            lightning_trainer_kwargs={"max_epochs": EPOCHS,
                                      "callbacks": [RecordRows(str(records))]}),
        run_config=RunConfig(name="datamodule", storage_path=str(tmp_path / "ray")),
        scaling_config=ScalingConfig(num_workers=2),
    )
    result = trainer.train()

    ranks = [json.loads((records / f"rank{r}.json").read_text()) for r in (0, 1)]
    for epoch in map(str, range(EPOCHS)):
        seen = [ranks[r]["rows"][epoch] for r in (0, 1)]
        # Each rank read its own half: disjoint, together every row once. Disjoint halves also
        # mean both ranks shuffled with the same permutation (the sampler's seed and epoch).
        assert len(seen[0]) == len(seen[1]) == ROWS // 2
        assert not set(seen[0]) & set(seen[1])
        assert sorted(seen[0] + seen[1]) == list(range(ROWS))
    for record in ranks:
        # set_epoch reshuffled: each epoch's order differs on every rank.
        assert record["rows"]["0"] != record["rows"]["1"]
        assert record["estimated_stepping_batches"] == EPOCHS * ROWS // 2 // BATCH
        assert record["global_step"] == EPOCHS * ROWS // 2 // BATCH
    assert sorted(ranks[0]["val_rows"] + ranks[1]["val_rows"]) == list(range(ROWS, ROWS + VAL_ROWS))

    # prepare_data ran once (one node, on its local rank 0); setup on every rank.
    hooks = sorted(p.name.split("-")[0] + "-" + p.name.split("-")[1] for p in data_dir.iterdir()
                   if p.suffix == ".json")
    assert hooks == ["prepare_data-rank0", "setup-rank0", "setup-rank1"]

    metrics = result["metrics"]
    assert {"train/loss", "val/loss"} <= set(metrics)
    assert metrics["global_batch_size"] == BATCH * 2  # measured from the DataModule's loader
    assert result["checkpoint_path"]


def test_prepare_data_per_node_false_runs_once_in_all(tmp_path):
    class OncePerRun(IndexedRegression):
        def __init__(self, data_dir: str):
            super().__init__(data_dir, rows=16, val_rows=8)
            self.prepare_data_per_node = False

    data_dir = tmp_path / "data"
    data_dir.mkdir()
    LightningTrainer(
        trainer_param=LightningTrainerParam(
            create_model_fn=Regressor, create_model_fn_kwargs={},
            create_datamodule_fn=OncePerRun,
            create_datamodule_fn_kwargs={"data_dir": str(data_dir)}),
        run_config=RunConfig(name="once", storage_path=str(tmp_path / "ray")),
        scaling_config=ScalingConfig(num_workers=2),
    ).train()
    prepared = [p.name for p in data_dir.iterdir() if p.name.startswith("prepare_data")]
    assert len(prepared) == 1 and prepared[0].startswith("prepare_data-rank0-")


@pytest.mark.lightning_packages
def test_a_datamodule_of_the_other_package_is_refused_on_the_driver(tmp_path):
    lightning = pytest.importorskip("lightning")

    class OtherPackage(lightning.LightningDataModule):
        pass

    with pytest.raises(ValueError) as refused:
        LightningTrainer(
            trainer_param=LightningTrainerParam(
                create_model_fn=Regressor, create_model_fn_kwargs={},
                create_datamodule_fn=OtherPackage),
            scaling_config=ScalingConfig(num_workers=2),
        )
    message = str(refused.value)
    assert "LightningTrainerParam.create_datamodule_fn=" in message
    assert "is a lightning.pytorch object" in message
    assert "Fix: import it from pytorch_lightning" in message


def test_the_memory_preflight_runs_with_a_datamodule(tmp_path):
    trainer = LightningTrainer(
        trainer_param=LightningTrainerParam(
            create_model_fn=Regressor, create_model_fn_kwargs={},
            create_datamodule_fn=IndexedRegression,
            create_datamodule_fn_kwargs={"data_dir": str(tmp_path)}),
        scaling_config=ScalingConfig(num_workers=2,
                                     resources_per_worker={"CPU": 1, "memory": 2**30}),
    )
    assert trainer.memory_estimate.parameters == 9  # nn.Linear(8, 1)
    assert trainer.global_batch_size is None  # the DataModule's loaders decide, on the workers
