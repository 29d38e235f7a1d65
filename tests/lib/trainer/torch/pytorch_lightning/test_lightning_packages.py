"""Modules written with either Lightning package train, each under its own package's Trainer.

Lightning's documentation writes ``import lightning as L``; the guide writes ``import
pytorch_lightning as pl``. With both packages installed (``make test`` runs this module with
the ``lightning`` package on the path, beside the venv's ``pytorch_lightning``), each module
trains with callbacks and strategies of its own package, and a run that mixes them is refused
on the driver. Hand-written Ray Train loops train in either package too, and a task that gives
Ray's ``lightning`` classes to a ``pytorch_lightning.Trainer`` is refused before its cluster
starts. Where ``lightning`` is not installed the module is skipped.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import pytorch_lightning as pl
import torch
from _models import SAME_IMPORTS_ENV, make_regression_datasets, ship_by_value
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
RAY_ENV_VARS = SAME_IMPORTS_ENV


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


def _hand_written_loops(config: dict) -> None:
    """Two hand-written Ray Train loops in one worker, one per package, as their docs write them.

    ``lightning``: Ray's own classes, which Ray built on that package. ``pytorch_lightning``: the
    builds of Ray's classes on it that ``ray_lightning`` hands out (Ray's own are ``lightning``
    classes here, which ``pytorch_lightning.Trainer`` refuses).
    """
    from ray.train.lightning import (
        RayDDPStrategy,
        RayLightningEnvironment,
        RayTrainReportCallback,
        prepare_trainer,
    )

    from michelangelo.lib.trainer.torch.pytorch_lightning import ray_lightning

    loader = torch.utils.data.DataLoader(
        [{"x": torch.randn(8), "y": torch.randn(())} for _ in range(32)], batch_size=8)
    quiet = {"max_epochs": 1, "enable_progress_bar": False, "enable_model_summary": False,
             "logger": False}
    trainer = L.Trainer(devices="auto", accelerator="auto", strategy=RayDDPStrategy(),
                        plugins=[RayLightningEnvironment()],
                        callbacks=[RayTrainReportCallback()], **quiet)
    trainer = prepare_trainer(trainer)
    trainer.fit(LitRegressor(config["lightning_dir"]), train_dataloaders=loader)

    ray_pl = ray_lightning("pytorch_lightning")
    trainer = pl.Trainer(devices="auto", accelerator="auto", strategy=ray_pl.ddp(),
                         plugins=[ray_pl.environment()], enable_checkpointing=False, **quiet)
    trainer = ray_pl.prepare_trainer(trainer)
    trainer.fit(PlRegressor(config["pytorch_lightning_dir"]), train_dataloaders=loader)
    path = os.path.join(config["pytorch_lightning_dir"], f"steps{trainer.global_rank}.json")
    with open(path, "w") as handle:
        json.dump({"world_size": trainer.world_size, "global_step": trainer.global_step}, handle)


def test_hand_written_ray_train_loops_train_in_either_package(tmp_path):
    from ray.train.torch import TorchTrainer

    dirs = {f"{package}_dir": tmp_path / package for package in CASES}
    for folder in dirs.values():
        folder.mkdir()
    result = TorchTrainer(
        _hand_written_loops, train_loop_config={k: str(v) for k, v in dirs.items()},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="hand-written", storage_path=str(tmp_path / "ray")),
    ).fit()

    assert result.error is None
    for rank in (0, 1):  # 32 rows over 2 ranks, batches of 8
        steps = json.loads((dirs["pytorch_lightning_dir"] / f"steps{rank}.json").read_text())
        assert steps == {"world_size": 2, "global_step": 2}
    for package, (_, _, expected) in CASES.items():
        for rank in (0, 1):
            record = json.loads((dirs[f"{package}_dir"] / f"rank{rank}.json").read_text())
            assert record["trainer"].startswith(expected), record
            assert any(name.startswith(f"{expected}.strategies") for name in record["strategy"])


MIXED_TASK = '''
import pytorch_lightning as pl
from ray.train import ScalingConfig
from ray.train.lightning import RayDDPStrategy, RayLightningEnvironment, prepare_trainer
from ray.train.torch import TorchTrainer

import michelangelo.uniflow.core as uniflow
from michelangelo.uniflow.plugins.ray import RayTask


def train_func():
    trainer = pl.Trainer(strategy=RayDDPStrategy(), plugins=[RayLightningEnvironment()])
    prepare_trainer(trainer)


@uniflow.task(config=RayTask(head_cpu=1, head_memory="2Gi", worker_cpu=2, worker_memory="2Gi",
                             worker_instances=1))
def train() -> str:
    return str(TorchTrainer(train_func, scaling_config=ScalingConfig(num_workers=2)).fit())


@uniflow.workflow()
def hand_written():
    return train()


if __name__ == "__main__":
    uniflow.create_context().run(hand_written)
'''


def test_a_task_giving_rays_lightning_classes_to_pytorch_lightning_is_refused_at_once(tmp_path):
    # As a user runs a script. Ray built its classes on `lightning` (installed here too), so
    # the loop would fail in pl.Trainer on every worker; the task is refused before its
    # cluster starts, with both fixes.
    script = tmp_path / "mixed.py"
    script.write_text(MIXED_TASK)
    env = dict(os.environ, UF_STORAGE_URL=str(tmp_path / "uniflow"))
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                          text=True, timeout=300)
    output = done.stdout + done.stderr
    assert done.returncode != 0, output[-4000:]
    assert "InputError" in output, output[-4000:]
    assert ("trains with pytorch_lightning and uses Ray's Lightning classes "
            "(RayDDPStrategy, RayLightningEnvironment, prepare_trainer)") in output
    assert "Fix: write the module on `lightning`" in output
    assert "ray_lightning('pytorch_lightning')" in output
    assert "attempt 2" not in output  # no retry
    assert "Ray dashboard" not in output and "cluster start" not in output, output[-4000:]
