"""DatasetVariable handles: Parquet storage, small pickles, fingerprints, clear errors."""

import os
import pickle
import posixpath

import pandas as pd
import pytest
import ray

import michelangelo.uniflow.core as uniflow
from michelangelo.uniflow.core._console import Reporter
from michelangelo.uniflow.core._storage import Storage
from michelangelo.workflow.variables import DatasetVariable
from michelangelo.workflow.variables._dataset_io import DatasetIO


@pytest.fixture(scope="module")
def ray_session():
    ray.init(address="local", num_cpus=2, include_dashboard=False,
             object_store_memory=150 * 2**20, logging_level="WARNING")
    yield
    ray.shutdown()


def _store(value, name="ds"):
    storage = Storage()
    folder = storage.join(name)
    storage.makedirs(folder)
    io = DatasetIO()
    meta = io.write(value, storage, folder)
    return io.travelling(value, storage, folder, meta), meta


def test_create_rejects_other_types_naming_them():
    with pytest.raises(TypeError, match="builtins.list"):
        DatasetVariable.create([1, 2, 3])


def test_pandas_round_trip_and_handle_is_small():
    frame = pd.DataFrame({f"c{i}": range(20000) for i in range(10)}).astype("float64")
    handle, meta = _store(DatasetVariable.create(frame))
    assert handle.num_rows == 20000 and "c9: double" in handle.schema
    assert len(pickle.dumps(handle)) < 2048
    pd.testing.assert_frame_equal(handle.load_pandas_dataframe(), frame)
    assert handle.value is not None
    # Loaded data never rides along in the pickle.
    assert len(pickle.dumps(handle)) < 2048


def test_fingerprint_follows_content():
    a, _ = _store(DatasetVariable.create(pd.DataFrame({"x": [1.0, 2.0]})), "a")
    b, _ = _store(DatasetVariable.create(pd.DataFrame({"x": [1.0, 2.0]})), "b")
    c, _ = _store(DatasetVariable.create(pd.DataFrame({"x": [1.0, 3.0]})), "c")
    assert a.fingerprint == b.fingerprint != c.fingerprint


def test_ray_dataset_round_trip(ray_session):
    ds = ray.data.range(5000).map(lambda r: {"id": r["id"], "sq": r["id"] ** 2})
    handle, _ = _store(ds)
    assert isinstance(handle, DatasetVariable) and handle.num_rows == 5000
    back = handle.load_ray_dataset()
    assert back.count() == 5000
    assert handle.value is back
    assert int(handle.load_pandas_dataframe()["sq"].sum()) == sum(i * i for i in range(5000))


def _footer_readers() -> int:
    """Ray Data's Parquet footer-reader actors this session has created (alive or not)."""
    return sum(1 for actor in ray._private.state.actors().values()
               if actor["ActorClassName"] == "FooterReader")


def test_a_small_stored_dataset_is_read_in_memory_as_ray_would_read_it(ray_session, tmp_path):
    import numpy as np

    rows = [{"id": i, "name": f"row {i}", "x": np.full((2, 3), i, dtype=np.float32)}
            for i in range(300)]
    ray.data.from_items(rows, override_num_blocks=3).write_parquet(str(tmp_path / "t"))
    handle = DatasetVariable(path=str(tmp_path / "t"), num_rows=300)
    before = _footer_readers()
    back = handle.load_ray_dataset()
    assert handle.value is back
    by_ray = ray.data.read_parquet(str(tmp_path / "t"))
    assert back.schema() == by_ray.schema()
    ours, theirs = (sorted(d.take_all(), key=lambda r: r["id"]) for d in (back, by_ray))
    assert [(r["id"], r["name"]) for r in ours] == [(r["id"], r["name"]) for r in theirs]
    assert all(np.array_equal(a["x"], b["x"]) and a["x"].shape == (2, 3)
               for a, b in zip(ours, theirs, strict=True))
    # Only Ray's own read listed the files on footer-reader actors.
    assert _footer_readers() - before == 32


def _files(handle: DatasetVariable) -> list[str]:
    import fsspec

    fs, path = fsspec.core.url_to_fs(handle.path)
    return sorted(posixpath.basename(f) for f in fs.find(path) if f.endswith(".parquet"))


def test_a_small_materialized_dataset_is_written_by_this_process_as_ray_writes_it(
        ray_session, monkeypatch):
    import numpy as np

    rows = [{"id": i, "name": f"row {i}", "x": np.full((2, 3), i, dtype=np.float32)}
            for i in range(300)]
    data = ray.data.from_items(rows, override_num_blocks=3).materialize()
    monkeypatch.delenv("MA_DATASET_DRIVER_WRITE_MAX_BYTES", raising=False)
    ours, _ = _store(data, "ours")
    monkeypatch.setenv("MA_DATASET_DRIVER_WRITE_MAX_BYTES", "0")
    theirs, _ = _store(data, "theirs")
    # One file per block, in block order (Ray Data names its files differently).
    assert _files(ours) == ["part-00000.parquet", "part-00001.parquet", "part-00002.parquet"]
    assert len(_files(theirs)) == 3 and not any(f.startswith("part-") for f in _files(theirs))
    assert ours.num_rows == theirs.num_rows == 300 and ours.schema == theirs.schema
    for reader in (lambda h: ray.data.read_parquet(h.path), lambda h: h.load_ray_dataset()):
        back, by_ray = reader(ours), reader(theirs)
        assert back.schema() == by_ray.schema()
        mine, expected = (sorted(d.take_all(), key=lambda r: r["id"]) for d in (back, by_ray))
        assert [(r["id"], r["name"]) for r in mine] == [(i, f"row {i}") for i in range(300)]
        assert [(r["id"], r["name"]) for r in expected] == [(i, f"row {i}") for i in range(300)]
        assert all(np.array_equal(a["x"], b["x"]) and a["x"].shape == (2, 3)
                   for a, b in zip(mine, expected, strict=True))
    # Read back in memory, the rows come in the order they were written.
    assert [r["id"] for r in ours.load_ray_dataset().take_all()] == list(range(300))
    # A lazy dataset, or one over the limit, is written by Ray Data.
    monkeypatch.delenv("MA_DATASET_DRIVER_WRITE_MAX_BYTES")
    lazy, _ = _store(ray.data.range(300, override_num_blocks=2).map(lambda r: r), "lazy")
    monkeypatch.setenv("MA_DATASET_DRIVER_WRITE_MAX_BYTES", "1Ki")
    large, _ = _store(data, "large")
    for handle in (lazy, large):
        assert _files(handle) and not any(f.startswith("part-") for f in _files(handle))
    assert lazy.num_rows == large.num_rows == 300


def test_a_bad_driver_read_limit_names_the_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("MA_DATASET_DRIVER_READ_MAX_BYTES", "lots")
    pd.DataFrame({"x": [1.0]}).to_parquet(tmp_path / "one.parquet")
    with pytest.raises(ValueError, match="MA_DATASET_DRIVER_READ_MAX_BYTES='lots'.*Fix"):
        DatasetVariable(path=str(tmp_path), num_rows=1).load_ray_dataset()


def test_a_stored_dataset_is_listed_by_one_footer_reader(ray_session, tmp_path, monkeypatch):
    """Read by Ray Data (the size of a large one), Parquet files are listed on a pool of 32
    new actor processes by default; three files need one. The process's own reads keep Ray's
    default pool afterwards."""
    monkeypatch.setenv("MA_DATASET_DRIVER_READ_MAX_BYTES", "0")
    ray.data.range(3000, override_num_blocks=3).write_parquet(str(tmp_path / "three"))
    handle = DatasetVariable(path=str(tmp_path / "three"), num_rows=3000)
    before = _footer_readers()
    assert handle.load_ray_dataset().materialize().count() == 3000
    assert _footer_readers() - before == 1
    assert "RAY_DATA_PARQUET_FOOTER_NUM_ACTORS" not in os.environ
    before = _footer_readers()
    assert ray.data.read_parquet(str(tmp_path / "three")).materialize().count() == 3000
    assert _footer_readers() - before == 32


def test_missing_files_fail_naming_the_path(tmp_path):
    handle = DatasetVariable(path=str(tmp_path / "gone"), num_rows=1)
    with pytest.raises(FileNotFoundError, match="gone"):
        handle.load_pandas_dataframe()
    with pytest.raises(FileNotFoundError, match="gone"):
        handle.load_ray_dataset()


def test_tasks_pass_handles_and_tuples_of_them(ray_session):
    @uniflow.task()
    def split() -> tuple:
        frame = pd.DataFrame({"x": range(100)})
        return DatasetVariable.create(frame[:80]), DatasetVariable.create(frame[80:])

    @uniflow.task()
    def sizes(train: DatasetVariable, val: pd.DataFrame) -> list:
        return [train.num_rows, len(val)]

    @uniflow.workflow()
    def wf() -> list:
        train, val = split()
        assert isinstance(train, DatasetVariable) and train.is_stored
        return sizes(train, val)

    assert uniflow.Context(reporter=Reporter()).run(wf) == [80, 20]
