"""In-memory ingest: the path decision, batches, collate formats, resume, and end-to-end runs."""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import sys

import numpy as np
import pyarrow as pa
import pytest
import pytorch_lightning as pl
import ray
import ray._private.state
import torch
from _models import create_tiny_model, make_regression_datasets, ship_by_value
from ray.data.collate_fn import ArrowBatchCollateFn, NumpyBatchCollateFn, PandasBatchCollateFn
from ray.train import RunConfig, ScalingConfig

from michelangelo.lib.trainer.torch.pytorch_lightning import (
    LightningTrainer,
    LightningTrainerParam,
)
from michelangelo.lib.trainer.torch.pytorch_lightning._ingest._data import SizedBatches
from michelangelo.lib.trainer.torch.pytorch_lightning._ingest._inmemory_data import (
    InMemoryBatches,
    drain_blocks,
    drain_shard,
    known_size_bytes,
    plan_ingest,
    shuffle_seed,
    split_for_workers,
)
from michelangelo.settings import TRAINER_INMEMORY, TRAINER_INMEMORY_MAX_BYTES

ship_by_value(__name__)

_QUICKSTART = os.path.join(os.path.dirname(__file__), *[os.pardir] * 6, "examples",
                           "quickstart", "workflow.py")


RAY_PRESERVE_ORDER = True  # two passes over one dataset are compared


def _load_quickstart():
    spec = importlib.util.spec_from_file_location("quickstart_workflow_for_tests", _QUICKSTART)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # cloudpickle ships only modules it can find by name
    spec.loader.exec_module(module)
    ship_by_value(module)
    return module


quickstart = _load_quickstart()


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in (TRAINER_INMEMORY.name, TRAINER_INMEMORY_MAX_BYTES.name, "PL_GLOBAL_SEED"):
        monkeypatch.delenv(name, raising=False)


def id_table(rows: int) -> pa.Table:
    rng = np.random.default_rng(0)
    return pa.table({"id": np.arange(rows), "x": rng.normal(size=rows).astype(np.float32)})


def ids(batches) -> list[int]:
    return [int(i) for b in batches for i in b["id"]]


# --- the decision, on the driver ---------------------------------------------------------


def scaling(workers: int = 2, memory: int | None = None) -> ScalingConfig:
    return ScalingConfig(num_workers=workers,
                         resources_per_worker={"CPU": 1, **({"memory": memory} if memory else {})})


@pytest.mark.usefixtures("ray_cluster")
def test_threshold_decides_from_known_size_and_worker_memory(monkeypatch):
    train, val = make_regression_datasets(64, 16)
    train, val = train.materialize(), val.materialize()
    size = known_size_bytes(train) + known_size_bytes(val)
    assert size > 0
    shard = -(-size // 2)
    # 25% of the declared worker memory against the per-worker shard.
    assert plan_ingest(train, val, scaling(memory=4 * shard)).in_memory
    plan = plan_ingest(train, val, scaling(memory=4 * shard - 8))
    assert not plan.in_memory and "streaming" in plan.reason and f"{shard:,}" in plan.reason
    monkeypatch.setenv(TRAINER_INMEMORY_MAX_BYTES.name, str(shard))
    assert plan_ingest(train, val, scaling(memory=8)).in_memory
    monkeypatch.setenv(TRAINER_INMEMORY_MAX_BYTES.name, str(shard - 1))
    assert not plan_ingest(train, val, scaling(memory=10**12)).in_memory


@pytest.mark.usefixtures("ray_cluster")
def test_switch_forces_either_path_and_bad_values_name_the_variable(monkeypatch):
    train, _ = make_regression_datasets(32, 8)
    train = train.materialize()
    monkeypatch.setenv(TRAINER_INMEMORY.name, "0")
    assert not plan_ingest(train, None, scaling(memory=10**12)).in_memory
    monkeypatch.setenv(TRAINER_INMEMORY.name, "1")
    monkeypatch.setenv(TRAINER_INMEMORY_MAX_BYTES.name, "1")
    assert plan_ingest(train, None, scaling()).in_memory
    monkeypatch.setenv(TRAINER_INMEMORY.name, "sometimes")
    with pytest.raises(ValueError, match=f"{TRAINER_INMEMORY.name}='sometimes'.*Fix"):
        plan_ingest(train, None, scaling())
    monkeypatch.setenv(TRAINER_INMEMORY.name, "auto")
    monkeypatch.setenv(TRAINER_INMEMORY_MAX_BYTES.name, "two gigs")
    with pytest.raises(ValueError, match=f"{TRAINER_INMEMORY_MAX_BYTES.name}='two gigs'.*Fix"):
        plan_ingest(train, None, scaling())


@pytest.mark.usefixtures("ray_cluster")
def test_unknown_size_streams_without_executing_the_dataset():
    lazy = ray.data.range(1000).map_batches(lambda b: {"id": b["id"] * 2})
    assert known_size_bytes(lazy) is None
    plan = plan_ingest(lazy, None, scaling(memory=10**12))
    assert not plan.in_memory and "unknown" in plan.reason


@pytest.mark.usefixtures("ray_cluster")
def test_parquet_size_is_estimated_from_row_count_and_fixed_widths(tmp_path):
    import pyarrow.parquet as pq
    from ray.data.extensions import ArrowTensorArray

    x = np.zeros((300, 8), dtype=np.float32)
    fixed = pa.table({"x": ArrowTensorArray.from_numpy(x), "y": x[:, 0], "id": np.arange(300)})
    (tmp_path / "fixed").mkdir()
    pq.write_table(fixed, tmp_path / "fixed" / "part.parquet")
    ds = ray.data.read_parquet(str(tmp_path / "fixed"))
    shard = 300 * (8 * 4 + 4 + 8) // 2
    plan = plan_ingest(ds, None, scaling(memory=4 * shard))
    assert plan.in_memory and "estimated" in plan.reason and f"{shard:,}" in plan.reason
    assert plan.train_rows == 300  # counted once here, reused for the streaming length
    assert not plan_ingest(ds, None, scaling(memory=4 * shard - 8)).in_memory
    (tmp_path / "text").mkdir()
    pq.write_table(fixed.append_column("s", pa.array(["a"] * 300)), tmp_path / "text" / "p.parquet")
    text = plan_ingest(ray.data.read_parquet(str(tmp_path / "text")), None,
                       scaling(memory=10**12))
    assert not text.in_memory and "unknown" in text.reason


@pytest.mark.usefixtures("ray_cluster")
def test_driver_split_gives_each_worker_equal_distinct_rows():
    import ray.data

    data = ray.data.from_arrow([id_table(4), id_table(7).set_column(0, "id", pa.array(
        range(4, 11)))])
    parts = split_for_workers({"train": data}, 3)["train"]
    tables = [drain_blocks(refs) for refs in parts]
    assert [t.num_rows for t in tables] == [3, 3, 3]  # 11 rows: the remainder is dropped
    seen = [i for t in tables for i in t.column("id").to_pylist()]
    assert len(set(seen)) == 9 and set(seen) <= set(range(11))


@pytest.mark.usefixtures("ray_cluster")
def test_a_users_data_config_keeps_ray_trains_sharding(monkeypatch, tmp_path):
    from ray.train import DataConfig
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

    monkeypatch.setenv(TRAINER_INMEMORY.name, "1")
    seen = []

    def launch(self):  # stands in for Ray Train's fit: what would it have been given?
        seen.append((sorted(self.datasets), self.train_loop_config["spec"].shard_blocks))
        return None

    monkeypatch.setattr(DataParallelTrainer, "fit", launch)
    train, val = make_regression_datasets(32, 8)
    for config in (None, DataConfig(datasets_to_split=["train"])):
        trainer = LightningTrainer(
            trainer_param=LightningTrainerParam(
                create_model_fn=create_tiny_model, create_model_fn_kwargs={},
                train_data=train, val_data=val, batch_size=8),
            run_config=RunConfig(name="cfg", storage_path=str(tmp_path)),
            scaling_config=scaling(), dataset_config=config)
        trainer.fit()
        assert sorted(trainer.datasets) == ["train", "val"]
    (default_datasets, blocks), (own_datasets, own_blocks) = seen
    assert default_datasets == [] and sorted(blocks) == ["train", "val"]
    assert len(blocks["train"]) == 2  # one list of block refs per worker
    # Val is not to be split under the user's config: Ray Train keeps the datasets.
    assert own_datasets == ["train", "val"] and own_blocks is None


def test_shuffle_seed_is_stable_per_run_and_follows_seed_everything(monkeypatch):
    assert shuffle_seed("/runs/a") == shuffle_seed("/runs/a") != shuffle_seed("/runs/b")
    monkeypatch.setenv("PL_GLOBAL_SEED", "7")
    assert shuffle_seed("/runs/a") == shuffle_seed(None) == 7


# --- batches ------------------------------------------------------------------------------


def test_every_row_once_per_epoch_new_order_each_epoch_exact_length():
    data = InMemoryBatches(id_table(50), 8, shuffle=True, seed=3)
    assert len(data) == 7
    epochs = []
    for epoch in range(3):
        data.sampler.set_epoch(epoch)
        batches = list(data)
        assert len(batches) == len(data) and [len(b["id"]) for b in batches][-1] == 2
        epochs.append(ids(batches))
        assert sorted(epochs[-1]) == list(range(50))
    assert len({tuple(e) for e in epochs}) == 3
    data.sampler.set_epoch(1)  # a resumed epoch replays the same order
    assert ids(data) == epochs[1]
    assert ids(InMemoryBatches(id_table(50), 8, shuffle=True, seed=3, rank=1)) != epochs[0]
    assert ids(InMemoryBatches(id_table(50), 8, shuffle=False)) == list(range(50))
    assert len(InMemoryBatches(id_table(50), 8, shuffle=False, drop_last=True)) == 6


def test_batches_kept_from_an_epoch_survive_the_next():
    data = InMemoryBatches(id_table(16), 8, shuffle=True)
    first = next(iter(data))
    kept = first["id"].clone()
    data.sampler.set_epoch(1)
    list(data)
    assert torch.equal(first["id"], kept)


class NumpyCollate(NumpyBatchCollateFn):
    def __call__(self, batch):
        return ("numpy", type(batch).__name__, sorted(batch), type(batch["x"]).__name__)


class ArrowCollate(ArrowBatchCollateFn):
    def __call__(self, batch):
        return ("arrow", type(batch).__name__, batch.column_names, batch.num_rows)


class PandasCollate(PandasBatchCollateFn):
    def __call__(self, batch):
        return ("pandas", type(batch).__name__, list(batch.columns), list(batch.index))


def plain_collate(batch):
    return ("plain", type(batch).__name__, sorted(batch), batch["x"].dtype.str)


@pytest.mark.usefixtures("ray_cluster")
@pytest.mark.parametrize("collate_fn", [None, plain_collate, NumpyCollate(), ArrowCollate(),
                                        PandasCollate()])
def test_collate_fn_sees_what_the_streaming_path_gives_it(collate_fn):
    train, _ = make_regression_datasets(32, 8)
    train = train.materialize()
    streamed = list(SizedBatches(train.iterator(), 32, 8, collate_fn=collate_fn))
    in_memory = list(InMemoryBatches(drain_shard(train.iterator()), 8, shuffle=False,
                                     collate_fn=collate_fn))
    assert len(streamed) == len(in_memory) == 4
    if collate_fn is None:
        for s, m in zip(streamed, in_memory, strict=True):
            assert s.keys() == m.keys()
            for key in s:
                assert s[key].dtype == m[key].dtype and torch.equal(s[key], m[key])
    else:
        assert streamed == in_memory


# --- resume through a real Lightning checkpoint ---------------------------------------------


class IdModel(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.seen: dict[int, list[int]] = {}

    def training_step(self, batch, batch_idx):
        self.seen.setdefault(self.current_epoch, []).extend(int(i) for i in batch["id"])
        return ((self.w - batch["x"].float()) ** 2).mean()

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", ((self.w - batch["x"].float()) ** 2).mean())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def fit(epochs: int, ckpt_path=None, save_to=None) -> dict[int, list[int]]:
    model = IdModel()
    trainer = pl.Trainer(max_epochs=epochs, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         accelerator="cpu", devices=1)
    trainer.fit(model, train_dataloaders=InMemoryBatches(id_table(40), 8, shuffle=True, seed=5),
                val_dataloaders=InMemoryBatches(id_table(16), 8, shuffle=False),
                ckpt_path=ckpt_path)
    if save_to:
        trainer.save_checkpoint(save_to)
    return model.seen


def test_lightning_fit_with_validation_and_resume_replays_the_epoch_orders(tmp_path):
    uninterrupted = fit(3)
    assert all(sorted(v) == list(range(40)) for v in uninterrupted.values())
    assert uninterrupted[0] != uninterrupted[1] != uninterrupted[2]
    ckpt = str(tmp_path / "epoch1.ckpt")
    assert fit(1, save_to=ckpt) == {0: uninterrupted[0]}
    assert fit(3, ckpt_path=ckpt) == {1: uninterrupted[1], 2: uninterrupted[2]}


# --- end to end: both paths on the quickstart model -------------------------------------------


CONTEXT_PROBE = "michelangelo_test_probe"


class RecordingRegressor(quickstart.Regressor):
    """The quickstart model, writing the row ids each rank trains on per epoch."""

    def __init__(self, record_dir: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.record_dir = record_dir
        self.seen: dict[int, list[int]] = {}

    def training_step(self, batch, batch_idx):
        self.seen.setdefault(self.current_epoch, []).extend(int(i) for i in batch["id"])
        return super().training_step(batch, batch_idx)

    def on_train_end(self) -> None:
        with open(os.path.join(self.record_dir, f"rank{self.global_rank}.json"), "w") as f:
            json.dump(self.seen, f)
        # The driver's Ray Data context, as this worker sees it.
        probe = ray.data.DataContext.get_current().get_config(CONTEXT_PROBE)
        with open(os.path.join(self.record_dir, f"context{self.global_rank}.json"), "w") as f:
            json.dump(probe, f)


def create_recording_model(record_dir: str) -> RecordingRegressor:
    torch.manual_seed(0)  # the reference fit's starting weights, on every worker
    return RecordingRegressor(record_dir, hidden_dim=32, learning_rate=1e-2)


def rows_with_id(batch: dict) -> dict:
    return {"id": batch["id"], **quickstart._rows(batch)}


class CountingSplitTrainer(LightningTrainer):
    """Test double: a ``LightningTrainer`` that records each in-memory split it makes."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.splits: list[tuple[list[str], int]] = []

    def split_for_workers(self, datasets, workers):
        self.splits.append((sorted(datasets), workers))
        return split_for_workers(datasets, workers)


def train_once(tmp_path, monkeypatch, switch: str, train, val) -> tuple[dict, LightningTrainer]:
    record_dir = tmp_path / f"records-{switch}"
    record_dir.mkdir()
    monkeypatch.setenv(TRAINER_INMEMORY.name, switch)
    trainer = CountingSplitTrainer(
        trainer_param=LightningTrainerParam(
            create_model_fn=create_recording_model,
            create_model_fn_kwargs={"record_dir": str(record_dir)},
            train_data=train, val_data=val, batch_size=32,
            lightning_trainer_kwargs={"max_epochs": 3, "log_every_n_steps": 10},
        ),
        run_config=RunConfig(name=f"ingest-{switch}", storage_path=str(tmp_path / "ray")),
        scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1}),
    )
    before = set(ray._private.state.actors())  # the GCS's actor table (no dashboard here)
    context = ray.data.DataContext.get_current()
    context.set_config(CONTEXT_PROBE, f"driver-{switch}")
    try:
        result = trainer.train()
    finally:
        context.remove_config(CONTEXT_PROBE)
    started = {a["ActorClassName"] for key, a in ray._private.state.actors().items()
               if key not in before}
    # In memory, Ray Train has no datasets, so no dataset manager actor starts either.
    assert ("DatasetManager" in started) is (switch == "0"), started
    assert "RayTrainWorker" in started, started
    contexts = [json.loads(p.read_text()) for p in sorted(record_dir.glob("context*.json"))]
    assert contexts == [f"driver-{switch}"] * 2  # both paths carry the driver's context over
    seen = {}
    for path in sorted(glob.glob(str(record_dir / "rank*.json"))):
        with open(path) as handle:
            seen[path] = {int(k): v for k, v in json.load(handle).items()}
    # In memory, the driver splits once and Ray Train gets no datasets (no split coordinator).
    assert trainer.splits == ([(["train", "val"], 2)] if switch == "1" else [])
    assert sorted(trainer.datasets) == ["train", "val"]  # handed back after the fit
    return {"val_loss": float(result["metrics"]["val_loss"]), "seen": seen}, trainer


@pytest.fixture(scope="module")
def quickstart_data(ray_cluster):
    """Quickstart rows with an id column, split as the quickstart does, plus a reference loss:
    the same model fitted by plain single-process Lightning on the same training rows, with
    the trainer's global batch (2 workers x 32), so both take the same optimizer steps."""
    data = ray.data.range(1600).map_batches(rows_with_id, batch_size=400)
    train, val = (d.materialize() for d in data.train_test_split(test_size=0.2, seed=0))
    frames = {"train": train.to_pandas(), "val": val.to_pandas()}

    def loader(frame, shuffle: bool):
        x = torch.from_numpy(np.stack(frame["x"].to_numpy()))
        y = torch.from_numpy(frame["y"].to_numpy())
        return torch.utils.data.DataLoader(
            [{"x": a, "y": b} for a, b in zip(x, y, strict=True)], batch_size=64,
            shuffle=shuffle)

    torch.manual_seed(0)
    model = quickstart.create_model(hidden_dim=32, learning_rate=1e-2)
    trainer = pl.Trainer(max_epochs=3, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         accelerator="cpu", devices=1)
    trainer.fit(model, loader(frames["train"], True), loader(frames["val"], False))
    reference = float(trainer.callback_metrics["val_loss"])
    return train, val, sorted(int(i) for i in frames["train"]["id"]), reference


@pytest.mark.parametrize("switch", ["1", "0"], ids=["in_memory", "streaming"])
def test_every_row_once_per_epoch_and_the_loss_of_plain_lightning(
        tmp_path, monkeypatch, quickstart_data, switch):
    train, val, all_ids, reference = quickstart_data
    result, trainer = train_once(tmp_path, monkeypatch, switch, train, val)
    assert bool(trainer.splits) is (switch == "1")  # in memory: the driver split the data
    assert len(result["seen"]) == 2
    for epoch in range(3):
        union = sorted(i for seen in result["seen"].values() for i in seen[epoch])
        assert union == all_ids, epoch  # 1280 rows split evenly in two: each exactly once
    if switch == "1":
        rank0 = list(result["seen"].values())[0]
        assert rank0[0] != rank0[1]  # a fresh full shuffle each epoch
    # 60 optimizer steps from the reference's own seeded start: both paths learn (the first
    # epoch's val_loss is about 0.07) and land within the data order's noise of plain
    # Lightning's loss.
    assert result["val_loss"] < 0.08, (result["val_loss"], reference)
    assert abs(result["val_loss"] - reference) < 0.03, (result["val_loss"], reference)
