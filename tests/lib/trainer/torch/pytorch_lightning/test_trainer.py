"""End-to-end LightningTrainer runs on real Ray Train workers (2 CPU workers, tiny data)."""

from __future__ import annotations

import contextlib
import glob
import json
import os
import signal
import time

import psutil
import pytest
import torch
from _models import (
    create_probe_model,
    make_regression_datasets,
    read_records,
    ship_by_value,
)
from pytorch_lightning.callbacks import ModelCheckpoint
from ray.train import CheckpointConfig, RunConfig, ScalingConfig

from michelangelo.lib.trainer.torch.pytorch_lightning import (
    LightningTrainer,
    LightningTrainerParam,
)
from michelangelo.uniflow.plugins.ray import CapacityError

ship_by_value(__name__)

# Ray Train's controller passes this on to the workers it starts.
POLL_ENV = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"


pytestmark = pytest.mark.usefixtures("ray_cluster")


class FileObserver:
    """Writes one JSON line per event into ``directory`` (workers and driver alike)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def _append(self, name: str, record: dict) -> None:
        with open(os.path.join(self.directory, name), "a") as handle:
            handle.write(json.dumps(record) + "\n")

    def on_result(self, metrics, checkpoint_path):
        self._append("on_result.jsonl", {"pid": os.getpid(), "metrics": metrics,
                                         "checkpoint_path": checkpoint_path})

    def on_checkpoint_saved(self, epoch, step, metrics, checkpoint_path):
        import ray.train

        self._append("on_checkpoint_saved.jsonl", {
            "pid": os.getpid(), "rank": ray.train.get_context().get_world_rank(),
            "epoch": epoch, "step": step, "metrics": metrics, "path": checkpoint_path,
            "poll_interval": os.environ.get(POLL_ENV),
        })


class FloatCollate:
    """Collate numpy columns to float32 tensors; leaves a marker file showing it ran."""

    def __init__(self, marker_dir: str) -> None:
        self.marker_dir = marker_dir

    def __call__(self, batch):
        open(os.path.join(self.marker_dir, f"collate-{os.getpid()}"), "w").close()
        return {k: torch.as_tensor(v, dtype=torch.float32) for k, v in batch.items()}


def recording_sink(trainer, profiler_dir):
    record_dir = trainer.lightning_module.record_dir
    with open(os.path.join(record_dir, f"sink-rank{trainer.global_rank}.json"), "w") as handle:
        files = [os.path.relpath(os.path.join(d, f), profiler_dir)
                 for d, _, names in os.walk(profiler_dir) for f in names]
        json.dump({"dir": profiler_dir, "files": sorted(files)}, handle)


def read_jsonl(path):
    with open(path) as handle:
        return [json.loads(line) for line in handle]


def _controllers_started_since(start: float) -> list[int]:
    """Pids of this test's Ray Train controller processes started at or after ``start``.

    Only this process's descendants (its local Ray's workers): another test run on the
    machine may have controllers of its own.
    """
    pids = []
    for proc in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            cmdline = " ".join(proc.cmdline())
            if "TrainController" in cmdline and proc.create_time() >= start - 1:
                pids.append(proc.pid)
    return pids


def _lines(path):
    return read_jsonl(path) if os.path.exists(path) else []


def test_train_returns_keys_exact_schedule_observer_collate_and_profiler(tmp_path, monkeypatch):
    monkeypatch.delenv(POLL_ENV, raising=False)
    records, events = tmp_path / "records", tmp_path / "events"
    records.mkdir()
    events.mkdir()
    train, val = make_regression_datasets(64, 16)
    sigint_before, started = signal.getsignal(signal.SIGINT), time.time()
    trainer = LightningTrainer(
        trainer_param=LightningTrainerParam(
            create_model_fn=create_probe_model,
            create_model_fn_kwargs={"record_dir": str(records), "warmup_steps": 1,
                                    "floor": 0.1, "lr": 1e-2},
            train_data=train,
            val_data=val,
            batch_size=8,
            data_collate_fn=FloatCollate(str(records)),
            training_observer=FileObserver(str(events)),
            profiler_sink=recording_sink,
            lightning_trainer_kwargs={"max_epochs": 2, "accumulate_grad_batches": 2,
                                      "profiler": "simple"},
        ),
        run_config=RunConfig(name="e2e", storage_path=str(tmp_path / "ray")),
        scaling_config=ScalingConfig(num_workers=2),
    )
    result = trainer.train()

    assert set(result) == {"checkpoint_path", "path", "metrics"}
    assert os.path.isfile(os.path.join(result["checkpoint_path"], "checkpoint.ckpt"))
    assert result["path"] == str(tmp_path / "ray" / "e2e")
    # 64 rows / 2 workers / batch 8 = 4 batches; accumulation 2 -> 2 steps per epoch.
    assert result["metrics"]["global_batch_size"] == 8 * 2 * 2
    assert result["metrics"]["step"] == 4
    assert "val_loss" in result["metrics"]

    starts, ends = read_records(str(records), "fit_start"), read_records(str(records), "train_end")
    assert [r["rank"] for r in starts] == [0, 1]
    assert all(r["estimated_stepping_batches"] == 4 for r in starts)
    assert all(r["num_training_batches"] == 4 for r in ends)
    assert all(r["global_step"] == 4 for r in ends)
    # The warmup + cosine schedule ends exactly at its floor.
    assert all(r["lr"] == pytest.approx(1e-2 * 0.1) for r in ends)
    assert glob.glob(str(records / "collate-*"))

    on_result = read_jsonl(events / "on_result.jsonl")
    assert len(on_result) == 1 and on_result[0]["pid"] == os.getpid()
    assert on_result[0]["checkpoint_path"] == result["checkpoint_path"]
    saved = read_jsonl(events / "on_checkpoint_saved.jsonl")
    assert sorted((s["rank"], s["epoch"]) for s in saved) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert all(s["pid"] != os.getpid() for s in saved)
    # The controller polled every 0.25 s, not Ray's 2 s (each report waits for a poll), and the
    # setting ended with the fit.
    assert {s["poll_interval"] for s in saved} == {"0.25"}
    assert POLL_ENV not in os.environ
    # Ctrl-C after the fit reaches the script again (Ray Train's handler, which aborts the
    # run's controller, is gone), and that handler no longer keeps the finished controller.
    assert signal.getsignal(signal.SIGINT) is sigint_before
    deadline = time.time() + 60
    while _controllers_started_since(started) and time.time() < deadline:
        time.sleep(0.5)
    assert _controllers_started_since(started) == []
    final = [s for s in saved if s["epoch"] == 1]
    assert {s["path"] for s in final} == {result["checkpoint_path"]}
    assert all(os.path.isdir(s["path"]) for s in saved if s["epoch"] == 1)

    # Profiler output in the node's profiler_logs, shipped once per node (local rank 0).
    sinks = sorted(glob.glob(str(records / "sink-rank*.json")))
    assert [os.path.basename(p) for p in sinks] == ["sink-rank0.json"]
    with open(sinks[0]) as handle:
        sink = json.load(handle)
    assert os.path.basename(sink["dir"]) == "profiler_logs"
    # One folder per rank of the node, each with that rank's report.
    for rank in (0, 1):
        assert any(name.startswith(f"rank-{rank}{os.sep}") and "profile" in name
                   for name in sink["files"]), sink["files"]


def test_model_checkpoint_monitor_reports_and_native_resume_continues(tmp_path):
    records = tmp_path / "records"
    records.mkdir()
    train, val = make_regression_datasets(64, 16)
    storage = str(tmp_path / "ray")

    def make(max_epochs, events):
        events.mkdir()
        return LightningTrainer(
            trainer_param=LightningTrainerParam(
                create_model_fn=create_probe_model,
                create_model_fn_kwargs={"record_dir": str(records)},
                train_data=train,
                val_data=val,
                training_observer=FileObserver(str(events)),
                profiler_sink=recording_sink,
                lightning_trainer_kwargs={
                    "max_epochs": max_epochs,
                    "callbacks": [ModelCheckpoint(monitor="val_loss", mode="min",
                                                  save_top_k=1, dirpath=str(tmp_path / "pl"))],
                    "profiler": "simple",
                    "profiler_kwargs": {"upload_profiler_results": False},
                },
            ),
            run_config=RunConfig(
                name="resume", storage_path=storage,
                checkpoint_config=CheckpointConfig(num_to_keep=2,
                                                   checkpoint_score_attribute="val_loss",
                                                   checkpoint_score_order="min"),
            ),
            scaling_config=ScalingConfig(num_workers=2),
        )

    first = make(1, tmp_path / "events1").train()
    assert first["metrics"]["step"] == 4
    saved = read_jsonl(tmp_path / "events1" / "on_checkpoint_saved.jsonl")
    assert len(saved) == 2  # one ModelCheckpoint save, reported by both ranks
    assert "val_loss" in saved[0]["metrics"]
    assert not glob.glob(str(records / "sink-*"))  # upload_profiler_results=False

    second = make(3, tmp_path / "events2").train()
    starts = read_records(str(records), "train_start")
    assert [(r["global_step"], r["epoch"]) for r in starts] == [(4, 1), (4, 1)]  # resumed
    assert second["metrics"]["step"] == 12
    assert second["checkpoint_path"] != first["checkpoint_path"]


def test_capacity_error_before_any_worker_starts(tmp_path):
    train, val = make_regression_datasets(16, 8)
    trainer = LightningTrainer(
        trainer_param=LightningTrainerParam(
            create_model_fn=create_probe_model,
            create_model_fn_kwargs={"record_dir": str(tmp_path)},
            train_data=train, val_data=val,
        ),
        run_config=RunConfig(name="too-big", storage_path=str(tmp_path / "ray")),
        scaling_config=ScalingConfig(num_workers=8),
    )
    with pytest.raises(CapacityError, match="num_workers=8"):
        trainer.train()
    assert not (tmp_path / "ray" / "too-big").exists()
