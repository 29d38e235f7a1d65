"""Failures: a worker dying mid-epoch is retried; a killed driver's run resumes on rerun."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import ray
from _models import (
    create_probe_model,
    make_regression_datasets,
    read_records,
    ship_by_value,
)
from ray.train import FailureConfig, RunConfig, ScalingConfig

from michelangelo.lib.trainer.torch.pytorch_lightning import (
    LightningTrainer,
    LightningTrainerParam,
)

ship_by_value(__name__)
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, *[".."] * 5))


pytestmark = pytest.mark.usefixtures("ray_cluster")


def _train(tmp_path, name, records, max_failures=0, **model_kwargs):
    train, val = make_regression_datasets(64, 16)
    return LightningTrainer(
        trainer_param=LightningTrainerParam(
            create_model_fn=create_probe_model,
            create_model_fn_kwargs={"record_dir": str(records), **model_kwargs},
            train_data=train, val_data=val,
            lightning_trainer_kwargs={"max_epochs": 2}),
        run_config=RunConfig(name=name, storage_path=str(tmp_path / "ray"),
                             failure_config=FailureConfig(max_failures=max_failures)),
        scaling_config=ScalingConfig(num_workers=2),
    ).train()


def test_worker_killed_mid_epoch_is_retried_to_the_same_final_step(tmp_path):
    clean, faulted = tmp_path / "clean", tmp_path / "faulted"
    clean.mkdir()
    faulted.mkdir()
    baseline = _train(tmp_path, "clean", clean)
    marker = tmp_path / "died-once"
    # Step 5 is inside epoch 2, after the epoch-1 checkpoint (step 4) was reported.
    snapshot = tmp_path / "ray" / "faulted" / "checkpoint_manager_snapshot.json"
    result = _train(tmp_path, "faulted", faulted, max_failures=1, exit_at_step=5,
                    exit_marker=str(marker), exit_wait_for=str(snapshot))
    assert marker.exists()  # the worker really died once
    assert result["metrics"]["step"] == baseline["metrics"]["step"] == 8
    ends = read_records(str(faulted), "train_end")
    assert [e["global_step"] for e in ends] == [8, 8]
    # The retry started from the reported checkpoint, not from scratch.
    starts = read_records(str(faulted), "train_start")
    assert [(s["global_step"], s["epoch"]) for s in starts] == [(4, 1), (4, 1)]


DRIVER = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {here!r})
    import ray
    from _models import create_probe_model, make_regression_datasets, ship_by_value
    from ray.train import RunConfig, ScalingConfig
    from michelangelo.lib.trainer.torch.pytorch_lightning import (
        LightningTrainer, LightningTrainerParam)

    ray.init(address={address!r}, log_to_driver=False)
    train, val = make_regression_datasets(64, 16)
    result = LightningTrainer(
        trainer_param=LightningTrainerParam(
            create_model_fn=create_probe_model,
            create_model_fn_kwargs={{"record_dir": {records!r}, "lr": 5e-2,
                                    "step_sleep": {sleep!r}, "tag": sys.argv[1]}},
            train_data=train, val_data=val,
            lightning_trainer_kwargs={{"max_epochs": 4}}),
        run_config=RunConfig(name="killed", storage_path={storage!r}),
        scaling_config=ScalingConfig(num_workers=2),
    ).train()
    print("FINAL_STEP", result["metrics"]["step"])
    """
)


def _losses(records, tag):
    with open(os.path.join(records, "losses.jsonl")) as handle:
        rows = [json.loads(line) for line in handle]
    return [r for r in rows if r["tag"] == tag]


def _checkpoint_registered(storage):
    # Ray's controller writes its snapshot once it has registered a reported checkpoint; a
    # checkpoint folder alone may still be waiting for registration.
    return os.path.exists(os.path.join(storage, "killed", "checkpoint_manager_snapshot.json"))


def test_sigkilled_driver_resumes_loss_curve_and_step(tmp_path):
    records, storage = tmp_path / "rec", tmp_path / "ray"
    records.mkdir()
    address = ray.get_runtime_context().gcs_address
    script = tmp_path / "driver.py"
    script.write_text(DRIVER.format(here=HERE, address=address, records=str(records),
                                    storage=str(storage), sleep=0.4))
    env = {**os.environ, "PYTHONPATH": REPO}
    first = subprocess.Popen([sys.executable, str(script), "first"], cwd=REPO, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 900  # a hang, not a slow machine, should trip it
        while not _checkpoint_registered(str(storage)) and first.poll() is None:
            assert time.monotonic() < deadline, "no checkpoint was reported in time"
            time.sleep(0.1)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    assert first.returncode == -signal.SIGKILL
    assert not read_records(str(records), "train_end")  # it really was cut short
    killed = _losses(str(records), "first")
    time.sleep(2)  # let Ray reap the dead driver's actors

    second = subprocess.run([sys.executable, str(script), "second"], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=1200)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "FINAL_STEP 16" in second.stdout
    starts = read_records(str(records), "train_start")
    resumed_step = starts[0]["global_step"]
    assert resumed_step >= 4 and resumed_step % 4 == 0
    assert all(s["global_step"] == resumed_step for s in starts)
    resumed = _losses(str(records), "second")
    # The curve continues: steps pick up after the checkpoint, and the loss is not back at
    # its untrained value.
    assert resumed[0]["step"] == resumed_step
    assert [r["step"] for r in resumed] == list(range(resumed_step, 16))
    # Mean over one epoch (4 steps) smooths batch noise: the resumed epoch trains better
    # than the killed run's first, untrained epoch did.
    mean = lambda rows: sum(r["loss"] for r in rows) / len(rows)  # noqa: E731
    assert mean(resumed[:4]) < mean(killed[:4])
    # And the weights it started from are those of a checkpoint the killed run reported.
    import torch

    snapshot_dir = storage / "killed"
    saved = [torch.load(os.path.join(snapshot_dir, d, "checkpoint.ckpt"), weights_only=False)
             for d in os.listdir(snapshot_dir)
             if d.startswith("checkpoint_") and os.path.isdir(snapshot_dir / d)]
    at_resume = [c for c in saved if c["global_step"] == resumed_step]
    assert at_resume, [c["global_step"] for c in saved]
    for key, values in starts[0]["weights"].items():
        expected = at_resume[0]["state_dict"][key].flatten().tolist()
        assert values == pytest.approx(expected)
