"""The metrics record and the progress state on a plain in-process Lightning fit (no Ray)."""

from __future__ import annotations

import pytorch_lightning as pl
import torch
from _models import TinyRegressor, regression_rows

from michelangelo.lib.trainer.torch.pytorch_lightning._worker._metrics_record import (
    MetricsRecord,
    read_metrics,
)
from michelangelo.lib.trainer.torch.pytorch_lightning._worker._progress import ProgressReport
from michelangelo.uniflow.core._console import format_progress


class RecordingProgress(ProgressReport):
    """Keeps each state it would publish, instead of sending it to Ray's key-value store."""

    def __init__(self) -> None:
        super().__init__("test", rows_per_batch=8, every_s=0.0)
        self.states: list[dict] = []

    def _send(self, trainer, done=False):
        self.states.append(self.state(trainer, done))


def _loader():
    rows = [{"x": torch.tensor(r["x"]), "y": torch.tensor(r["y"])} for r in regression_rows(64)]
    return torch.utils.data.DataLoader(rows, batch_size=8)


def test_record_and_progress_without_any_logger(tmp_path):
    url = str(tmp_path / "metrics" / "fit.jsonl")
    progress = RecordingProgress()
    trainer = pl.Trainer(max_epochs=3, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         log_every_n_steps=1, callbacks=[MetricsRecord(url), progress])
    trainer.fit(TinyRegressor(), _loader(), _loader())

    rows = read_metrics(url)
    train = [r for r in rows if r["name"] == "train_loss"]
    val = [r for r in rows if r["name"] == "val_loss"]
    assert [r["step"] for r in train] == list(range(24))  # 8 batches x 3 epochs, every step
    assert [r["epoch"] for r in val] == [0, 1, 2]
    assert all(isinstance(r["value"], float) and r["time"] > 0 for r in rows)

    last = progress.states[-1]
    assert last["done"] and last["step"] == last["total_steps"] == 24
    assert (last["epoch"], last["max_epochs"]) == (2, 3)
    assert set(last["metrics"]) == {"train_loss", "val_loss"} and last["rows_per_s"] > 0
    assert format_progress(last).startswith("epoch 3/3  step 24/24  ")
    assert progress.states[0]["step"] == 0 and not progress.states[0]["done"]
