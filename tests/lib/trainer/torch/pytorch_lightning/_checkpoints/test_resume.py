"""Auto-resume: decided at construction; Ray's snapshot wins; the store is the fallback."""

from __future__ import annotations

import logging
import os

import pytest
from _models import (
    create_probe_model,
    make_regression_datasets,
    read_records,
    ship_by_value,
)
from ray.train import RunConfig, ScalingConfig

from michelangelo.lib.trainer.torch.pytorch_lightning import (
    FsspecExperimentStore,
    LightningTrainer,
    LightningTrainerParam,
)
from michelangelo.lib.trainer.torch.pytorch_lightning._checkpoints._resume import plan_resume
from michelangelo.uniflow.plugins.ray import CapacityError

ship_by_value(__name__)


pytestmark = pytest.mark.usefixtures("ray_cluster")


def _fake_experiment(root, name, checkpoints=("checkpoint_2026-01-01_00-00-00.000001",)):
    folder = root / name
    for checkpoint in checkpoints:
        (folder / checkpoint).mkdir(parents=True)
        (folder / checkpoint / "checkpoint.ckpt").write_bytes(b"x")
    return folder


def test_skipped_with_info_when_name_or_storage_missing(caplog, tmp_path):
    store = FsspecExperimentStore(root=str(tmp_path / "store"))
    with caplog.at_level(logging.INFO):
        plan = plan_resume(RunConfig(storage_path=str(tmp_path)), store)
    assert plan.seed_checkpoint is None and not plan.native
    assert "auto-resume skipped" in caplog.text and "'name'" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO):
        plan = plan_resume(RunConfig(name="named"), store)  # Ray's default storage path
    assert plan.seed_checkpoint is None and "'storage_path'" in caplog.text


def test_native_snapshot_wins_over_the_store(tmp_path):
    store = FsspecExperimentStore(root=str(tmp_path / "store"))
    other = _fake_experiment(tmp_path / "elsewhere", "old")
    store.track(str(tmp_path / "runs"), "run", str(other))
    folder = tmp_path / "runs" / "run"
    folder.mkdir(parents=True)
    (folder / "checkpoint_manager_snapshot.json").write_text("{}")
    plan = plan_resume(RunConfig(name="run", storage_path=str(tmp_path / "runs")), store)
    assert plan.native and plan.seed_checkpoint is None


def test_store_seeds_the_latest_checkpoint(tmp_path):
    store = FsspecExperimentStore(root=str(tmp_path / "store"))
    old = _fake_experiment(tmp_path / "elsewhere", "old", (
        "checkpoint_2026-01-01_00-00-00.000001", "checkpoint_2026-01-02_00-00-00.000001"))
    store.track(str(tmp_path / "runs"), "run", str(old))
    plan = plan_resume(RunConfig(name="run", storage_path=str(tmp_path / "runs")), store)
    assert plan.seed_checkpoint == str(old / "checkpoint_2026-01-02_00-00-00.000001")


def test_a_failing_store_means_fresh_start(tmp_path):
    class Broken:
        def track(self, *args):
            raise RuntimeError("down")

        def locate_resumable(self, *args):
            raise RuntimeError("down")

    plan = plan_resume(RunConfig(name="run", storage_path=str(tmp_path)), Broken())
    assert plan.seed_checkpoint is None and not plan.native


def _trainer(tmp_path, records, name, store, workers=2, max_epochs=1):
    train, val = make_regression_datasets(32, 8)
    return LightningTrainer(
        trainer_param=LightningTrainerParam(
            create_model_fn=create_probe_model,
            create_model_fn_kwargs={"record_dir": str(records)},
            train_data=train, val_data=val, experiment_store=store,
            lightning_trainer_kwargs={"max_epochs": max_epochs}),
        run_config=RunConfig(name=name, storage_path=str(tmp_path / "ray")),
        scaling_config=ScalingConfig(num_workers=workers),
    )


def test_run_config_passed_to_train_warns_with_a_store(tmp_path):
    store = FsspecExperimentStore(root=str(tmp_path / "store"))
    trainer = _trainer(tmp_path, tmp_path, "warned", store, workers=8)
    override = RunConfig(name="override", storage_path=str(tmp_path / "other"))
    with pytest.warns(UserWarning, match="auto-resume was decided at construction"), \
            pytest.raises(CapacityError):  # stops it before any worker starts
        trainer.train(run_config=override)
    assert trainer.run_config is override
    assert trainer.train_run_context.run_config is override


def test_store_resumes_when_ray_state_is_gone(tmp_path, caplog):
    records = tmp_path / "rec"
    records.mkdir()
    store = FsspecExperimentStore(root=str(tmp_path / "store"))
    first = _trainer(tmp_path, records, "stored", store).train()
    assert first["metrics"]["step"] == 2
    # Ray's own state is lost (e.g. the folder was copied without it): only the store knows.
    os.remove(tmp_path / "ray" / "stored" / "checkpoint_manager_snapshot.json")
    assert store.locate_resumable(str(tmp_path / "ray"), "stored") == str(
        tmp_path / "ray" / "stored")
    with caplog.at_level(logging.INFO):
        second = _trainer(tmp_path, records, "stored", store, max_epochs=2)
    assert "resuming from experiment_store checkpoint" in caplog.text  # decided at construction
    result = second.train()
    starts = read_records(str(records), "train_start")
    assert [s["global_step"] for s in starts] == [2, 2]
    assert result["metrics"]["step"] == 4


@pytest.mark.parametrize(("storage", "ray_path", "expected"), [
    # Ray Train's paths on an object store lack the scheme (pyarrow's S3 paths: bucket/key)
    ("s3://bucket/uniflow/ray", "bucket/uniflow/ray/run/checkpoint_0",
     "s3://bucket/uniflow/ray/run/checkpoint_0"),
    ("gs://bucket/ray/", "bucket/ray/run", "gs://bucket/ray/run"),
    # local storage keeps its plain paths, and a path that is a URI already stays one
    ("/tmp/ray", "/tmp/ray/run/checkpoint_0", "/tmp/ray/run/checkpoint_0"),
    ("file:///tmp/ray", "/tmp/ray/run/checkpoint_0", "/tmp/ray/run/checkpoint_0"),
    ("s3://bucket/ray", "s3://bucket/ray/run", "s3://bucket/ray/run"),
    ("s3://bucket/ray", None, None),
])
def test_result_paths_become_uris_of_the_runs_storage(storage, ray_path, expected):
    from michelangelo.lib.trainer.torch.pytorch_lightning._checkpoints import as_storage_uri

    assert as_storage_uri(ray_path, RunConfig(storage_path=storage, name="run")) == expected
