"""An install with only the ``lightning`` package: no ``pytorch_lightning`` anywhere.

``pip install "michelangelo[trainer-lightning]"`` without the guide's ``pytorch-lightning`` is
how many users who follow Lightning's own documentation install it. ``make test`` builds such
an install beside the main venv (``.venv/only-lightning``) and runs this module there; in an
install that has ``pytorch_lightning`` the module is skipped, since what it shows is that
nothing of ours reaches for that package when the module is a ``lightning`` one.

Both tests train on two Ray Train workers: one through ``LightningTrainer``, with callbacks
from ``lightning.pytorch.callbacks`` and a strategy by name, the other a loop written by hand
the way Ray's documentation writes one, with Ray's own Lightning classes.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys

import pytest

if importlib.util.find_spec("pytorch_lightning") is not None:
    pytest.skip("pytorch_lightning is installed here; make test runs this module in "
                ".venv/only-lightning", allow_module_level=True)
L = pytest.importorskip("lightning")

import cloudpickle  # noqa: E402
import numpy as np  # noqa: E402
import ray  # noqa: E402
import ray.cloudpickle  # noqa: E402
import torch  # noqa: E402
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint  # noqa: E402
from ray.train import RunConfig, ScalingConfig  # noqa: E402
from torch import nn  # noqa: E402

from michelangelo.lib.trainer.torch.pytorch_lightning import (  # noqa: E402
    LightningTrainer,
    LightningTrainerParam,
)

# Ray's workers cannot import this test module by name: its classes travel by value.
for _pickler in (ray.cloudpickle, cloudpickle):
    _pickler.register_pickle_by_value(sys.modules[__name__])


class LitRegressor(L.LightningModule):
    """A module as Lightning's docs write one."""

    def __init__(self, record_dir: str, lr: float = 0.05):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, x):
        return self.net(x).squeeze(-1)

    def training_step(self, batch, batch_idx):
        loss = nn.functional.mse_loss(self(batch["x"]), batch["y"])
        self.log("train/loss", loss, sync_dist=True)
        return loss

    def validation_step(self, batch, batch_idx):
        loss = nn.functional.mse_loss(self(batch["x"]), batch["y"])
        self.log("val/loss", loss, sync_dist=True)

    def on_fit_start(self):
        with open(os.path.join(self.hparams.record_dir, f"rank-{self.global_rank}.json"),
                  "w") as handle:
            json.dump({"trainer": type(self.trainer).__module__,
                       "strategy": type(self.trainer.strategy).__mro__[1].__module__,
                       "world_size": self.trainer.world_size}, handle)

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=self.hparams.lr)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
        return {"optimizer": optimizer,
                "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def rows(n: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 8)).astype(np.float32)
    y = (x @ np.linspace(-1, 1, 8, dtype=np.float32)).astype(np.float32)
    return [{"x": x[i], "y": y[i]} for i in range(n)]


def read_records(record_dir) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(record_dir.glob("rank-*.json"))]


@pytest.fixture(scope="module")
def local_ray():
    ray.init(address="local", num_cpus=3, include_dashboard=False,
             object_store_memory=200 * 2**20, log_to_driver=False)
    yield
    ray.shutdown()


def test_lightning_trainer_runs_a_lightning_module_with_its_callbacks(local_ray, tmp_path):
    record_dir = tmp_path / "records"
    record_dir.mkdir()
    result = LightningTrainer(
        trainer_param=LightningTrainerParam(
            create_model_fn=LitRegressor,
            create_model_fn_kwargs={"record_dir": str(record_dir)},
            train_data=ray.data.from_items(rows(64, 0)),
            val_data=ray.data.from_items(rows(16, 1)),
            lightning_trainer_kwargs={
                "max_epochs": 2,
                "strategy": "ddp",
                "log_every_n_steps": 1,
                "callbacks": [ModelCheckpoint(monitor="val/loss", save_top_k=1),
                              LearningRateMonitor(logging_interval="step")],
            }),
        run_config=RunConfig(name="only-lightning", storage_path=str(tmp_path / "ray")),
        scaling_config=ScalingConfig(num_workers=2),
    ).train()

    records = read_records(record_dir)
    assert [r["trainer"] for r in records] == ["lightning.pytorch.trainer.trainer"] * 2
    assert all(r["strategy"].startswith("lightning.pytorch.strategies") for r in records)
    assert [r["world_size"] for r in records] == [2, 2]
    metrics = result["metrics"]
    assert {"train/loss", "val/loss"} <= set(metrics)
    assert metrics["step"] == 8  # 32 rows per worker, batch size 8, two epochs
    assert os.path.exists(os.path.join(result["checkpoint_path"], "checkpoint.ckpt"))


def _hand_written_loop(config: dict) -> None:
    """Ray's documented Lightning loop, with ``import lightning`` as Lightning writes it."""
    import lightning as L
    from ray.train.lightning import (
        RayDDPStrategy,
        RayLightningEnvironment,
        RayTrainReportCallback,
        prepare_trainer,
    )
    from torch.utils.data import DataLoader

    trainer = L.Trainer(devices="auto", accelerator="auto", strategy=RayDDPStrategy(),
                        plugins=[RayLightningEnvironment()],
                        callbacks=[RayTrainReportCallback()], enable_progress_bar=False,
                        max_epochs=1)
    trainer = prepare_trainer(trainer)
    model = LitRegressor(record_dir=config["record_dir"])
    trainer.fit(model, train_dataloaders=DataLoader(rows(32, 0), batch_size=8),
                val_dataloaders=DataLoader(rows(16, 1), batch_size=8))


def test_a_hand_written_ray_train_loop_with_rays_lightning_classes(local_ray, tmp_path):
    from ray.train.torch import TorchTrainer

    record_dir = tmp_path / "records"
    record_dir.mkdir()
    result = TorchTrainer(
        _hand_written_loop, train_loop_config={"record_dir": str(record_dir)},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="only-lightning-loop", storage_path=str(tmp_path / "ray")),
    ).fit()

    records = read_records(record_dir)
    assert [r["world_size"] for r in records] == [2, 2]
    assert "val/loss" in result.metrics
    assert result.checkpoint is not None


def test_the_datamodule_example_runs_as_a_user_runs_it(tmp_path):
    """``examples/trainer/train_datamodule.py``, a subprocess in this install, as a user runs it.

    The example writes its DataModule with ``import lightning as L``; the run's console shows
    Lightning's own step count for the DataModule's loaders, and the global batch size the
    workers measured from them.
    """
    import subprocess
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[5])
    script = os.path.join(root, "examples", "trainer", "train_datamodule.py")
    env = dict(os.environ, UF_STORAGE_URL=str(tmp_path / "uniflow"))
    proc = subprocess.run([sys.executable, script, str(tmp_path / "data")], cwd=root, env=env,
                          capture_output=True, text=True, timeout=480)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-6000:]
    result = json.loads(proc.stdout.split("result: ", 1)[1].splitlines()[0])
    # 1024 rows, a fifth held out: 820 train rows, 410 per worker, 13 batches of 32 per epoch.
    assert result["step"] == 39
    assert result["global_batch_size"] == 64  # 32 per worker x 2 workers
    assert result["val/loss"] < 0.5
    assert os.path.exists(os.path.join(result["checkpoint_path"], "checkpoint.ckpt"))
    assert "step 39/39" in output and "rows/s" in output, output[-3000:]
    assert (tmp_path / "data" / "regression-1024.npz").exists()
