"""FsspecExperimentStore and latest_checkpoint_dir on real local and in-memory filesystems."""

from __future__ import annotations

import json
import logging
import os
import pickle
import time
import uuid

import cloudpickle
import fsspec
import pytest
import ray

from michelangelo.lib.trainer.torch.pytorch_lightning._checkpoints._experiment_store import (
    ExperimentStore,
    FsspecExperimentStore,
    latest_checkpoint_dir,
    record_key,
)

LOGGER = "michelangelo.lib.trainer.torch.pytorch_lightning._checkpoints._experiment_store"


def _make_checkpoint(experiment_dir, name, *, complete=True, as_dir=False):
    folder = os.path.join(experiment_dir, name)
    os.makedirs(folder, exist_ok=True)
    if complete:
        target = os.path.join(folder, "checkpoint.ckpt")
        if as_dir:  # sharded strategies write checkpoint.ckpt as a folder
            os.makedirs(target, exist_ok=True)
            with open(os.path.join(target, "shard_0.distcp"), "wb") as handle:
                handle.write(b"x")
        else:
            with open(target, "wb") as handle:
                handle.write(b"ckpt")
    return folder


@pytest.fixture
def memory_url():
    """A fresh, unique folder on fsspec's in-memory filesystem, removed afterwards."""
    url = f"memory://store-test-{uuid.uuid4().hex}"
    yield url
    fs = fsspec.filesystem("memory")
    path = url[len("memory://"):]
    if fs.exists(path):
        fs.rm(path, recursive=True)


# --- construction and protocol ------------------------------------------------------------------


def test_store_satisfies_protocol(tmp_path):
    store = FsspecExperimentStore(str(tmp_path))
    assert isinstance(store, ExperimentStore)
    assert not isinstance(object(), ExperimentStore)


def test_default_root_follows_uf_storage_url(tmp_path, monkeypatch):
    monkeypatch.setenv("UF_STORAGE_URL", str(tmp_path / "uf"))
    assert FsspecExperimentStore().root == str(tmp_path / "uf" / "experiment_store")
    monkeypatch.setenv("UF_STORAGE_URL", "memory://bucket/uf/")
    assert FsspecExperimentStore().root == "memory://bucket/uf/experiment_store"


def test_default_root_falls_back_to_home(tmp_path, monkeypatch):
    monkeypatch.delenv("UF_STORAGE_URL", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    expected = tmp_path / ".michelangelo" / "uniflow" / "experiment_store"
    assert FsspecExperimentStore().root == str(expected)


def test_relative_and_user_roots_are_made_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert FsspecExperimentStore("rel/store/").root == str(tmp_path / "rel" / "store")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert FsspecExperimentStore("~/s").root == str(tmp_path / "s")


@pytest.mark.parametrize("root", ["", "   ", 5])
def test_invalid_root_is_rejected_naming_the_field(root):
    with pytest.raises(ValueError, match="root") as info:
        FsspecExperimentStore(root)
    assert repr(root) in str(info.value)


def test_store_is_frozen(tmp_path):
    store = FsspecExperimentStore(str(tmp_path))
    with pytest.raises(AttributeError):
        store.root = "/elsewhere"


# --- track / locate_resumable on a local disk ----------------------------------------------------


def test_track_then_locate_on_local_disk(tmp_path):
    store = FsspecExperimentStore(str(tmp_path / "store"))
    experiment = tmp_path / "runs" / "my-run"
    _make_checkpoint(str(experiment), "checkpoint_2026-01-01_00-00-00.000001")

    store.track(str(tmp_path / "runs"), "my-run", str(experiment))

    assert store.locate_resumable(str(tmp_path / "runs"), "my-run") == str(experiment)
    record_file = tmp_path / "store" / f"{record_key(str(tmp_path / 'runs'), 'my-run')}.json"
    record = json.loads(record_file.read_text())
    assert record["experiment_dir"] == str(experiment)
    assert record["run_name"] == "my-run"
    # The write went through a temp file that is gone afterwards.
    assert [p.name for p in (tmp_path / "store").iterdir()] == [record_file.name]


def test_record_is_keyed_by_storage_path_and_name(tmp_path):
    store = FsspecExperimentStore(str(tmp_path / "store"))
    first, second = tmp_path / "a", tmp_path / "b"
    _make_checkpoint(str(first), "checkpoint_000000")
    _make_checkpoint(str(second), "checkpoint_000000")
    store.track("s3://bucket/runs", "run", str(first))
    store.track("s3://bucket/runs", "other-run", str(second))
    store.track("s3://bucket/elsewhere", "run", str(second))

    assert store.locate_resumable("s3://bucket/runs", "run") == str(first)
    # A trailing slash names the same storage path.
    assert store.locate_resumable("s3://bucket/runs/", "run") == str(first)
    assert store.locate_resumable("s3://bucket/runs", "other-run") == str(second)
    assert store.locate_resumable("s3://bucket/elsewhere", "run") == str(second)
    assert store.locate_resumable("s3://bucket/runs", "never-tracked") is None


def test_track_overwrites_the_previous_directory(tmp_path):
    store = FsspecExperimentStore(str(tmp_path / "store"))
    old, new = tmp_path / "old", tmp_path / "new"
    _make_checkpoint(str(old), "checkpoint_000000")
    _make_checkpoint(str(new), "checkpoint_000000")
    store.track("/runs", "r", str(old))
    store.track("/runs", "r", str(new))
    assert store.locate_resumable("/runs", "r") == str(new)


def test_concurrent_tracks_leave_one_whole_record(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    store = FsspecExperimentStore(str(tmp_path / "store"))
    dirs = [str(tmp_path / f"exp{i}") for i in range(8)]
    for directory in dirs:
        _make_checkpoint(directory, "checkpoint_000000")
    with ThreadPoolExecutor(max_workers=8) as pool:
        for _ in range(5):
            list(pool.map(lambda d: store.track("/runs", "r", d), dirs))
    assert store.locate_resumable("/runs", "r") in dirs
    assert len(list((tmp_path / "store").iterdir())) == 1  # no temp file left behind


def test_missing_directory_is_not_resumable(tmp_path):
    store = FsspecExperimentStore(str(tmp_path / "store"))
    store.track("/runs", "r", str(tmp_path / "was-deleted"))
    assert store.locate_resumable("/runs", "r") is None


def test_directory_without_a_complete_checkpoint_is_not_resumable(tmp_path):
    store = FsspecExperimentStore(str(tmp_path / "store"))
    experiment = tmp_path / "exp"
    experiment.mkdir()
    (experiment / "checkpoint_manager_snapshot.json").write_text("{}")
    store.track("/runs", "r", str(experiment))
    assert store.locate_resumable("/runs", "r") is None

    # A checkpoint folder still being written (no checkpoint.ckpt yet) does not count either.
    _make_checkpoint(str(experiment), "checkpoint_000003", complete=False)
    assert store.locate_resumable("/runs", "r") is None

    # A file that merely looks like a checkpoint folder does not count.
    (experiment / "checkpoint_000004").write_text("not a folder")
    assert store.locate_resumable("/runs", "r") is None

    _make_checkpoint(str(experiment), "checkpoint_000001")
    assert store.locate_resumable("/runs", "r") == str(experiment)


def test_corrupt_or_foreign_record_means_nothing_to_resume(tmp_path, caplog):
    store = FsspecExperimentStore(str(tmp_path / "store"))
    experiment = tmp_path / "exp"
    _make_checkpoint(str(experiment), "checkpoint_000000")
    store.track("/runs", "r", str(experiment))
    record_file = tmp_path / "store" / f"{record_key('/runs', 'r')}.json"

    record_file.write_text("{not json")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert store.locate_resumable("/runs", "r") is None
    assert "nothing to resume" in caplog.text

    record_file.write_text(json.dumps(["a", "list"]))
    assert store.locate_resumable("/runs", "r") is None

    # A record whose identity differs (a hash collision, or a hand-copied file) is ignored.
    record_file.write_text(json.dumps(
        {"storage_path": "/other", "run_name": "r", "experiment_dir": str(experiment)}))
    assert store.locate_resumable("/runs", "r") is None

    record_file.write_text(json.dumps({"storage_path": "/runs", "run_name": "r"}))
    assert store.locate_resumable("/runs", "r") is None


def test_unwritable_root_never_raises(tmp_path, caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("a file where the store wants a folder")
    # Even root cannot create a folder below a regular file.
    store = FsspecExperimentStore(str(blocker / "store"))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        store.track("/runs", "r", str(tmp_path))
        assert store.locate_resumable("/runs", "r") is None
    assert "could not record run" in caplog.text
    assert "'r'" in caplog.text


def test_unknown_protocol_root_never_raises(caplog):
    store = FsspecExperimentStore("nosuchprotocol://bucket/store")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        store.track("/runs", "r", "/somewhere")
        assert store.locate_resumable("/runs", "r") is None
    assert caplog.text.count("nosuchprotocol://bucket/store") >= 2


def test_unlistable_experiment_dir_is_not_resumable(tmp_path):
    store = FsspecExperimentStore(str(tmp_path / "store"))
    store.track("/runs", "r", "nosuchprotocol://bucket/exp")
    assert store.locate_resumable("/runs", "r") is None


# --- in-memory fsspec --------------------------------------------------------------------------


def test_track_then_locate_on_memory_filesystem(memory_url):
    fs = fsspec.filesystem("memory")
    root = memory_url[len("memory://"):]
    experiment = f"{memory_url}/runs/my-run"
    fs.pipe_file(f"{root}/runs/my-run/checkpoint_2026-01-01_00-00-00.000001/checkpoint.ckpt",
                 b"ckpt")
    store = FsspecExperimentStore(f"{memory_url}/store")

    store.track(f"{memory_url}/runs", "my-run", experiment)

    assert store.locate_resumable(f"{memory_url}/runs", "my-run") == experiment
    assert fs.ls(f"{root}/store", detail=False) == [
        f"/{root}/store/{record_key(f'{memory_url}/runs', 'my-run')}.json"
    ]
    assert store.locate_resumable(f"{memory_url}/runs", "other") is None

    fs.rm(f"{root}/runs", recursive=True)
    assert store.locate_resumable(f"{memory_url}/runs", "my-run") is None


# --- latest_checkpoint_dir ---------------------------------------------------------------------


def test_latest_checkpoint_by_ray_v2_timestamp(tmp_path):
    names = [
        "checkpoint_2026-03-01_09-00-00.000002",
        "checkpoint_2026-03-01_10-00-00.000001",  # latest by time, not written last
        "checkpoint_2026-02-28_23-59-59.999999",
    ]
    for name in names:
        _make_checkpoint(str(tmp_path), name)
    # Make the oldest-named folder the newest on disk: the name must win over mtime.
    os.utime(tmp_path / names[2], (time.time() + 100, time.time() + 100))
    assert latest_checkpoint_dir(str(tmp_path)) == str(tmp_path / names[1])


def test_latest_checkpoint_by_ray_v1_index(tmp_path):
    for name in ["checkpoint_000009", "checkpoint_000010", "checkpoint_000002"]:
        _make_checkpoint(str(tmp_path), name)
    assert latest_checkpoint_dir(str(tmp_path)) == str(tmp_path / "checkpoint_000010")


def test_latest_checkpoint_mixed_names_use_mtime(tmp_path):
    a = _make_checkpoint(str(tmp_path), "checkpoint_000005")
    b = _make_checkpoint(str(tmp_path), "checkpoint_custom")
    now = time.time()
    os.utime(a, (now, now))
    os.utime(b, (now - 60, now - 60))
    assert latest_checkpoint_dir(str(tmp_path)) == a
    os.utime(b, (now + 60, now + 60))
    assert latest_checkpoint_dir(str(tmp_path)) == b


def test_latest_checkpoint_skips_incomplete_and_accepts_sharded(tmp_path):
    _make_checkpoint(str(tmp_path), "checkpoint_000001", as_dir=True)
    _make_checkpoint(str(tmp_path), "checkpoint_000002", complete=False)
    (tmp_path / "not_a_checkpoint_000009").mkdir()
    assert latest_checkpoint_dir(str(tmp_path)) == str(tmp_path / "checkpoint_000001")


def test_latest_checkpoint_none_cases(tmp_path):
    assert latest_checkpoint_dir(str(tmp_path / "missing")) is None
    assert latest_checkpoint_dir(str(tmp_path)) is None
    (tmp_path / "file").write_text("x")
    assert latest_checkpoint_dir(str(tmp_path / "file")) is None
    assert latest_checkpoint_dir("nosuchprotocol://x/y") is None


def test_latest_checkpoint_on_memory_and_file_urls(memory_url, tmp_path):
    fs = fsspec.filesystem("memory")
    root = memory_url[len("memory://"):]
    fs.pipe_file(f"{root}/exp/checkpoint_000001/checkpoint.ckpt", b"1")
    fs.pipe_file(f"{root}/exp/checkpoint_000002/checkpoint.ckpt", b"2")
    assert latest_checkpoint_dir(f"{memory_url}/exp") == f"{memory_url}/exp/checkpoint_000002"

    _make_checkpoint(str(tmp_path), "checkpoint_000003")
    assert latest_checkpoint_dir(f"file://{tmp_path}") == f"file://{tmp_path}/checkpoint_000003"


# --- shipping the store to Ray workers ---------------------------------------------------------


def test_store_survives_pickling(tmp_path, monkeypatch):
    monkeypatch.setenv("UF_STORAGE_URL", str(tmp_path / "driver"))
    store = FsspecExperimentStore()
    for dumps, loads in ((cloudpickle.dumps, cloudpickle.loads), (pickle.dumps, pickle.loads)):
        copy = loads(dumps(store))
        assert copy == store
        assert isinstance(copy, ExperimentStore)
    # The root was fixed on the driver: a worker with another environment uses the same one.
    monkeypatch.setenv("UF_STORAGE_URL", str(tmp_path / "worker"))
    assert cloudpickle.loads(cloudpickle.dumps(store)).root == str(
        tmp_path / "driver" / "experiment_store")


def test_store_used_inside_ray_tasks(ray_cluster, tmp_path):
    store = FsspecExperimentStore(str(tmp_path / "store"))
    experiment = tmp_path / "exp"
    _make_checkpoint(str(experiment), "checkpoint_2026-01-01_00-00-00.000001")

    @ray.remote(num_cpus=1)
    def track_on_worker(store, experiment_dir):
        store.track("/runs", "ray-run", experiment_dir)
        return os.getpid()

    @ray.remote(num_cpus=1)
    def locate_on_worker(store):
        return store.locate_resumable("/runs", "ray-run")

    worker_pid = ray.get(track_on_worker.remote(store, str(experiment)))
    assert worker_pid != os.getpid()
    assert store.locate_resumable("/runs", "ray-run") == str(experiment)
    assert ray.get(locate_on_worker.remote(store)) == str(experiment)


# --- against the checkpoints a real Ray Train + Lightning run writes ----------------------------


def _two_epoch_loop(config: dict) -> None:
    import pytorch_lightning as pl
    import torch
    from ray.train.lightning import (
        RayDDPStrategy,
        RayLightningEnvironment,
        RayTrainReportCallback,
        prepare_trainer,
    )
    from torch.utils.data import DataLoader, TensorDataset

    class Linear(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.layer(x), y)
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    x = torch.randn(32, 2, generator=torch.Generator().manual_seed(0))
    trainer = pl.Trainer(
        max_epochs=2, accelerator="cpu", devices="auto", strategy=RayDDPStrategy(),
        plugins=[RayLightningEnvironment()], callbacks=[RayTrainReportCallback()],
        enable_checkpointing=False, enable_progress_bar=False, logger=False,
    )
    trainer = prepare_trainer(trainer)
    trainer.fit(Linear(), train_dataloaders=DataLoader(TensorDataset(x, x[:, :1]), batch_size=8))


def test_store_finds_the_latest_checkpoint_of_a_real_ray_run(ray_cluster, tmp_path):
    import sys

    import torch
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    storage, name = str(tmp_path / "ray_results"), "store-run"
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        result = TorchTrainer(
            _two_epoch_loop,
            scaling_config=ScalingConfig(num_workers=1, resources_per_worker={"CPU": 1}),
            run_config=RunConfig(name=name, storage_path=storage),
        ).fit()
    finally:
        ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    experiment_dir = os.path.join(storage, name)
    checkpoints = sorted(n for n in os.listdir(experiment_dir)
                         if n.startswith("checkpoint_") and os.path.isdir(os.path.join(experiment_dir, n)))
    assert len(checkpoints) == 2  # one per epoch, named the way latest_checkpoint_dir expects

    store = FsspecExperimentStore(str(tmp_path / "store"))
    store.track(storage, name, experiment_dir)
    # The store is the fallback for a lost Ray snapshot: it must not depend on that file.
    os.remove(os.path.join(experiment_dir, "checkpoint_manager_snapshot.json"))

    assert store.locate_resumable(storage, name) == experiment_dir
    latest = latest_checkpoint_dir(experiment_dir)
    assert latest == result.checkpoint.path
    checkpoint = torch.load(os.path.join(latest, "checkpoint.ckpt"), weights_only=False)
    assert checkpoint["epoch"] == 1
    assert checkpoint["global_step"] == 8  # 2 epochs x 4 batches: the end of the run
