"""initial_weights_path: local path, file:// and an fsspec URL; read once, loaded on all ranks."""

from __future__ import annotations

import os

import fsspec
import pytest
import torch
from _models import (
    ProbeRegressor,
    create_probe_model,
    make_regression_datasets,
    read_records,
    ship_by_value,
    tiny_state_dict,
)
from fsspec.implementations.memory import MemoryFileSystem
from ray.train import RunConfig, ScalingConfig

from michelangelo.lib.trainer.torch.pytorch_lightning import (
    LightningTrainer,
    LightningTrainerParam,
    TransferLearningSpec,
)
from michelangelo.lib.trainer.torch.pytorch_lightning._warm_start._weights import (
    check_weights_path,
    read_state_dict,
)

ship_by_value(__name__)

READ_LOG_ENV = "MICHELANGELO_TEST_READ_LOG"


pytestmark = pytest.mark.usefixtures("ray_cluster")


def counting_fs_class(read_log: str) -> type:
    """An in-memory filesystem under ``countmem://`` that logs every file opened for reading.

    Made per process (not at module level): fsspec caches instances, holding locks, on the
    class, and this module's classes are pickled by value to the workers.
    """

    class CountingMemoryFS(MemoryFileSystem):
        protocol = "countmem"

        @classmethod
        def _strip_protocol(cls, path):
            # MemoryFileSystem only knows its own "memory://" prefix.
            if path.startswith("countmem://"):
                path = path[len("countmem://"):]
            return MemoryFileSystem._strip_protocol(path)

        def _open(self, path, mode="rb", **kwargs):
            if "r" in mode:
                with open(read_log, "a") as handle:
                    handle.write(f"{os.getpid()} {path}\n")
            return super()._open(path, mode, **kwargs)

    return CountingMemoryFS


def install_counting_fs(read_log: str, blob: bytes, path: str) -> None:
    """Register ``countmem://`` in this process and put ``blob`` at ``path``."""
    cls = counting_fs_class(read_log)
    fsspec.register_implementation("countmem", cls, clobber=True)
    fs = cls()
    with fs.open(path, "wb") as handle:  # writing is not logged
        handle.write(blob)


def create_with_counting_fs(record_dir, read_log, blob_file, url):
    """Model factory that first makes the countmem:// file visible in this worker process.

    The memory filesystem lives in each process, so every worker gets its own copy of the
    bytes; only the reads of it are counted, and only rank 0 may read.
    """
    with open(blob_file, "rb") as handle:
        install_counting_fs(read_log, handle.read(), url[len("countmem://"):])
    return create_probe_model(record_dir)


@pytest.fixture(scope="module")
def data():
    return make_regression_datasets(32, 8)


class LazyProbeRegressor(ProbeRegressor):
    """:class:`ProbeRegressor` whose layers are created in ``configure_model()``."""

    def __init__(self, record_dir: str) -> None:
        super().__init__(record_dir)
        self.net = None

    def configure_model(self) -> None:
        if self.net is None:
            self.net = self.build_net(self.hparams.hidden_dim)


def create_lazy_probe(record_dir: str) -> LazyProbeRegressor:
    return LazyProbeRegressor(record_dir)


def _run(tmp_path, data, name, factory, kwargs, weights, **param):
    train, val = data
    LightningTrainer(
        trainer_param=LightningTrainerParam(
            create_model_fn=factory, create_model_fn_kwargs=kwargs, train_data=train,
            val_data=val, initial_weights_path=weights, **param),
        run_config=RunConfig(name=name, storage_path=str(tmp_path / "ray")),
        scaling_config=ScalingConfig(num_workers=2),
    ).train()


def _assert_loaded_everywhere(record_dir, fill):
    starts = read_records(record_dir, "fit_start")
    assert [r["rank"] for r in starts] == [0, 1]
    for record in starts:
        for values in record["weights"].values():
            assert values == pytest.approx([fill] * len(values))


def test_local_path_with_freezing(tmp_path, data):
    weights = tmp_path / "w.pt"
    torch.save(tiny_state_dict(fill=0.25), weights)
    records = tmp_path / "rec"
    records.mkdir()
    spec = TransferLearningSpec(layer_names_to_freeze=["net.0"],
                                layer_names_to_freeze_regex=[r"^net\.2\.bias$"])
    _run(tmp_path, data, "local", create_probe_model, {"record_dir": str(records)},
         str(weights), transfer_learning_spec=spec)
    _assert_loaded_everywhere(str(records), 0.25)
    for end in read_records(str(records), "train_end"):
        assert end["requires_grad"] == {"net.0.weight": False, "net.0.bias": False,
                                        "net.2.weight": True, "net.2.bias": False}
        # Frozen layers keep the loaded values; the trainable one moved.
        assert end["weights"]["net.0.weight"] == pytest.approx([0.25] * 64)
        assert end["weights"]["net.2.bias"] == pytest.approx([0.25])
        assert end["weights"]["net.2.weight"] != pytest.approx([0.25] * 8)


def test_file_url_lightning_checkpoint(tmp_path, data):
    weights = tmp_path / "w.ckpt"
    torch.save({"state_dict": tiny_state_dict(fill=0.5), "epoch": 3}, weights)
    records = tmp_path / "rec"
    records.mkdir()
    _run(tmp_path, data, "file", create_probe_model, {"record_dir": str(records)},
         f"file://{weights}")
    _assert_loaded_everywhere(str(records), 0.5)


def test_fsspec_url_is_read_once_by_rank_zero(tmp_path, data):
    import io

    buffer = io.BytesIO()
    torch.save(tiny_state_dict(fill=0.75), buffer)
    blob = tmp_path / "blob.pt"
    blob.write_bytes(buffer.getvalue())
    read_log, records = tmp_path / "reads.log", tmp_path / "rec"
    records.mkdir()
    url = "countmem://weights/model.pt"
    # The driver's own copy lets the driver-side existence check see the file (not a read).
    install_counting_fs(str(read_log), blob.read_bytes(), "/weights/model.pt")
    _run(tmp_path, data, "fsspec", create_with_counting_fs,
         {"record_dir": str(records), "read_log": str(read_log), "blob_file": str(blob),
          "url": url}, url)
    _assert_loaded_everywhere(str(records), 0.75)
    reads = read_log.read_text().splitlines()
    assert len(reads) == 1, reads
    assert int(reads[0].split()[0]) != os.getpid()  # read on a worker, not the driver


def test_check_weights_path(tmp_path):
    weights = tmp_path / "w.pt"
    torch.save(tiny_state_dict(), weights)
    check_weights_path(str(weights))
    check_weights_path(f"file://{weights}")
    with pytest.raises(ValueError, match="memory://nope/model.pt"):
        check_weights_path("memory://nope/model.pt")
    # A protocol the driver cannot use is left for the workers to judge.
    check_weights_path("unknownproto://bucket/model.pt")


def test_read_state_dict_rejects_non_dicts(tmp_path):
    path = tmp_path / "t.pt"
    torch.save(torch.zeros(3), path)
    with pytest.raises(ValueError, match="not a state dict"):
        read_state_dict(str(path))


def test_load_initial_weights_without_matching_keys_fails(tmp_path):
    from michelangelo.lib.trainer.torch.pytorch_lightning._warm_start._weights import (
        load_initial_weights,
    )

    path = tmp_path / "other.pt"
    torch.save({"encoder.weight": torch.zeros(2)}, path)
    model = create_probe_model(str(tmp_path))
    with pytest.raises(ValueError, match="none of its 1 keys"):
        load_initial_weights(model, str(path), rank=0, world_size=1)
    with pytest.raises(ValueError, match="could not be read on rank 0"):
        load_initial_weights(model, str(tmp_path / "missing.pt"), rank=0, world_size=1)


def test_weights_that_fit_only_the_configured_model_load_after_configure_model(tmp_path, data):
    weights = tmp_path / "w.pt"
    torch.save(tiny_state_dict(fill=0.75), weights)
    records = tmp_path / "rec"
    records.mkdir()
    _run(tmp_path, data, "lazy", create_lazy_probe, {"record_dir": str(records)}, str(weights))
    _assert_loaded_everywhere(str(records), 0.75)


def test_weights_that_fit_neither_shape_fail_on_the_driver_as_on_the_workers(tmp_path, data):
    path = tmp_path / "other.pt"
    torch.save({"encoder.weight": torch.zeros(2)}, path)
    for factory in (create_probe_model, create_lazy_probe):
        with pytest.raises(ValueError, match="none of its 1 keys"):
            _run(tmp_path, data, "never", factory, {"record_dir": str(tmp_path)}, str(path))
    assert not (tmp_path / "ray").exists()  # refused before any worker started
