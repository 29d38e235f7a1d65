"""The practice's rank-dependent collective, caught by the stall watchdog in seconds.

``lightning-in-depth`` warns that a collective on some ranks only, such as ``self.log(...,
sync_dist=True)`` under ``if self.global_rank == 0``, deadlocks until the process group's
timeout. Here that module trains on two workers; the run fails with ``TrainingStalledError``
naming rank 0's line, within ``stall_timeout_s`` plus the time Ray needs to end the group.
"""

from __future__ import annotations

import time

import pytest
import pytorch_lightning as pl
import torch
from _models import ISOLATED_STATE_API, make_regression_datasets, ship_by_value
from ray.train import RunConfig, ScalingConfig
from torch import nn

from michelangelo.lib.trainer.torch.pytorch_lightning import (
    LightningTrainer,
    LightningTrainerParam,
    TrainingStalledError,
)

ship_by_value(__name__)

pytestmark = pytest.mark.usefixtures("ray_cluster")
RAY_NUM_CPUS = 3
RAY_ENV_VARS = dict(ISOLATED_STATE_API)
STALL_TIMEOUT_S = 15


class RankZeroLogs(pl.LightningModule):
    """The practice's bug: a synced metric logged on rank 0 only."""

    def __init__(self):
        super().__init__()
        self.net = nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        loss = nn.functional.mse_loss(self.net(batch["x"]).squeeze(-1), batch["y"])
        if self.global_rank == 0:
            self.log("train/loss", loss, sync_dist=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def test_a_collective_on_rank_zero_only_fails_the_run_naming_its_line(tmp_path):
    train, _ = make_regression_datasets(64, 8)
    trainer = LightningTrainer(
        trainer_param=LightningTrainerParam(
            create_model_fn=RankZeroLogs, create_model_fn_kwargs={},
            train_data=train, val_data=None, stall_timeout_s=STALL_TIMEOUT_S),
        run_config=RunConfig(name="stall", storage_path=str(tmp_path / "ray")),
        scaling_config=ScalingConfig(num_workers=2),
    )
    started = time.monotonic()
    with pytest.raises(TrainingStalledError) as stalled:
        trainer.train()
    verdict_s = time.monotonic() - started
    message = str(stalled.value)
    print(f"stall verdict after {verdict_s:.1f} s (stall_timeout_s={STALL_TIMEOUT_S})\n{message}")
    assert f"stall_timeout_s={STALL_TIMEOUT_S} s" in message
    assert "rank 0: " in message and "rank 1: " in message
    rank_zero = next(line for line in message.splitlines() if line.startswith("  rank 0: "))
    assert "test_stall_watchdog.py:" in rank_zero
    assert 'self.log("train/loss", loss, sync_dist=True)' in rank_zero
    assert "Fix: run the same collectives on every rank" in message
    assert isinstance(stalled.value, RuntimeError) and isinstance(stalled.value, ValueError)
