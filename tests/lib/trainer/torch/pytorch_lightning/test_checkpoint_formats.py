"""Tests for ``michelangelo.lib.checkpoints``: detection, loaders, remote sources and key alignment.

Checkpoints are real: a single-process Lightning fit for the single-file format, and two Ray
Train workers (gloo, CPU) for FSDP2 DCP and DeepSpeed ZeRO-3. Each distributed run also
gathers its full weights on rank 0 as the reference the loaders must reproduce. FSDP1 cannot run
on CPU (Lightning refuses ``"fsdp"`` without a GPU); its sharded layout is checked here on a DCP
folder written the way Lightning's FSDP strategy writes it, and end to end in the GPU test of
``test_state_dict.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import pytorch_lightning as pl
import ray
import torch
from _cpu_deepspeed import DEEPSPEED_CPU_ENV, CpuDeepSpeedStrategy
from _models import (
    ISOLATED_STATE_API,
    TinyRegressor,
    create_tiny_fsdp2_model,
    create_tiny_model,
    regression_loader,
    ship_by_value,
)
from ray.train import Checkpoint, RunConfig, ScalingConfig

from michelangelo.lib.checkpoints import CheckpointFormat
from michelangelo.lib.checkpoints import _formats as cf
from michelangelo.lib.trainer.torch.pytorch_lightning._strategies._fsdp2 import (
    RayModelParallelStrategy,
)

ship_by_value(__name__)



RAY_ENV_VARS = {**ISOLATED_STATE_API, **DEEPSPEED_CPU_ENV}


def _assert_same_weights(loaded: dict, reference: dict) -> None:
    assert sorted(loaded) == sorted(reference)
    for key, value in reference.items():
        assert isinstance(loaded[key], torch.Tensor)
        assert loaded[key].dtype == torch.float32
        torch.testing.assert_close(loaded[key], value, msg=key)


# ---------------------------------------------------------------------------------------------
# Single file (ddp / fsdp full), no Ray needed to produce it
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def full_file_run(tmp_path_factory):
    """A Ray-layout folder holding a single-file Lightning checkpoint, and the trained weights."""
    torch.manual_seed(0)
    model = create_tiny_model()
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, train_dataloaders=regression_loader())
    folder = tmp_path_factory.mktemp("ddp") / "checkpoint_000000"
    folder.mkdir()
    trainer.save_checkpoint(folder / cf.CHECKPOINT_NAME)
    return folder, {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_full_file_detected_and_loaded(full_file_run):
    folder, reference = full_file_run
    entry = cf.resolve_checkpoint_entry(folder)
    assert entry == folder / cf.CHECKPOINT_NAME
    assert cf.detect_format(entry) is CheckpointFormat.FULL_FILE
    _assert_same_weights(cf.load_full_file(entry), reference)
    for strategy in (None, "ddp", "fsdp", pl.strategies.DDPStrategy()):
        _assert_same_weights(cf.load_state_dict(folder, strategy), reference)
    # The Lightning checkpoint itself works as a source too, not only the Ray folder.
    _assert_same_weights(cf.load_state_dict(entry), reference)


def test_file_url_memory_url_and_ray_checkpoint_sources(full_file_run):
    import fsspec

    folder, reference = full_file_run
    _assert_same_weights(cf.load_state_dict(f"file://{folder}"), reference)

    # A non-local fsspec filesystem: the folder is downloaded to a temp dir first.
    memory = fsspec.filesystem("memory")
    memory.put(str(folder) + "/", "/ckpt-test/run/", recursive=True)
    try:
        _assert_same_weights(cf.load_state_dict("memory://ckpt-test/run"), reference)
    finally:
        memory.rm("/ckpt-test", recursive=True)

    _assert_same_weights(cf.load_state_dict(Checkpoint.from_directory(str(folder))), reference)


def test_ray_checkpoint_on_a_remote_filesystem_is_downloaded(full_file_run):
    import fsspec
    import pyarrow.fs

    folder, reference = full_file_run
    memory = fsspec.filesystem("memory")
    memory.put(str(folder) + "/", "/ray-remote/ckpt/", recursive=True)
    try:
        remote_fs = pyarrow.fs.PyFileSystem(pyarrow.fs.FSSpecHandler(memory))
        checkpoint = Checkpoint(path="/ray-remote/ckpt", filesystem=remote_fs)
        _assert_same_weights(cf.load_state_dict(checkpoint, "ddp"), reference)
    finally:
        memory.rm("/ray-remote", recursive=True)


def test_missing_source_names_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope"):
        cf.load_state_dict(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="memory://absent/x"):
        cf.load_state_dict("memory://absent/x")


def test_strategy_format_mismatch_is_a_clear_error(full_file_run):
    folder, _ = full_file_run
    with pytest.raises(ValueError) as info:
        cf.load_state_dict(folder, "deepspeed")
    message = str(info.value)
    assert "single file" in message and "'deepspeed'" in message and "DeepSpeed ZeRO" in message
    with pytest.raises(ValueError, match="fsdp2"):
        cf.load_state_dict(folder, RayModelParallelStrategy())


def test_unknown_strategy_string_and_unknown_folder(tmp_path):
    with pytest.raises(ValueError, match="'horovod'"):
        cf.expected_formats("horovod")
    (tmp_path / "random.txt").write_text("x")
    with pytest.raises(ValueError, match="random.txt"):
        cf.detect_format(tmp_path)


def test_non_lightning_file_is_rejected(tmp_path):
    path = tmp_path / "weights.pt"
    torch.save({"net.0.weight": torch.zeros(1)}, path)
    with pytest.raises(ValueError, match="no 'state_dict' entry"):
        cf.load_full_file(path)


def test_expected_formats_follow_strategy_settings():
    fsdp2_full = RayModelParallelStrategy()
    fsdp2_full._save_distributed_checkpoint = False  # only reachable with a user-built instance
    assert cf.expected_formats(fsdp2_full) == {CheckpointFormat.FULL_FILE}
    assert cf.expected_formats(RayModelParallelStrategy()) == {CheckpointFormat.FSDP2_DCP}
    assert cf.expected_formats(CpuDeepSpeedStrategy(stage=2)) == {CheckpointFormat.DEEPSPEED_ZERO}
    assert cf.expected_formats("FSDP2") == {CheckpointFormat.FSDP2_DCP}
    assert cf.expected_formats(pl.strategies.SingleDeviceStrategy("cpu")) == {
        CheckpointFormat.FULL_FILE
    }


# ---------------------------------------------------------------------------------------------
# FSDP1 sharded layout (the real FSDP1 run is GPU-only)
# ---------------------------------------------------------------------------------------------


def test_fsdp1_sharded_layout_is_detected_and_loaded(tmp_path):
    import torch.distributed.checkpoint as dcp

    torch.manual_seed(1)
    reference = TinyRegressor().state_dict()
    folder = tmp_path / cf.CHECKPOINT_NAME
    # Lightning's FSDPStrategy(state_dict_type="sharded") saves {"model": ..., "optimizer_0": ...}
    # with DCP plus a meta.pt; reproduce that layout without a GPU.
    dcp.save({"model": reference, "optimizer_0": {"step": torch.tensor(3)}}, checkpoint_id=folder,
             no_dist=True)
    torch.save({"epoch": 0, "global_step": 3}, folder / "meta.pt")
    assert cf.detect_format(folder) is CheckpointFormat.FSDP_SHARDED
    _assert_same_weights(cf.load_state_dict(tmp_path, "fsdp"), reference)
    with pytest.raises(ValueError, match="fsdp2"):
        cf.load_state_dict(tmp_path, "fsdp2")


# ---------------------------------------------------------------------------------------------
# Key alignment
# ---------------------------------------------------------------------------------------------


def test_align_keeps_exact_keys():
    sd = {"net.0.weight": 1, "net.0.bias": 2}
    assert cf.align_state_dict_keys(sd, ["net.0.weight", "net.0.bias"]) == (sd, "")


def test_align_strips_the_lightning_attribute_prefix():
    sd = {"net.0.weight": 1, "net.2.bias": 2, "loss_scale": 3}
    aligned, prefix = cf.align_state_dict_keys(sd, ["0.weight", "2.bias"])
    assert prefix == "net."
    # Keys without the prefix stay put so they are reported as unexpected, not lost.
    assert aligned == {"0.weight": 1, "2.bias": 2, "loss_scale": 3}


def test_align_picks_the_prefix_that_matches_most_keys():
    sd = {"model.encoder.a": 1, "model.encoder.b": 2, "model.head.c": 3}
    aligned, prefix = cf.align_state_dict_keys(sd, ["a", "b"])
    assert prefix == "model.encoder."
    assert aligned["a"] == 1 and aligned["b"] == 2 and aligned["model.head.c"] == 3


def test_align_without_any_match_changes_nothing():
    sd = {"x.y": 1}
    assert cf.align_state_dict_keys(sd, ["z"]) == (sd, "")


# ---------------------------------------------------------------------------------------------
# Distributed checkpoints from two Ray Train workers
# ---------------------------------------------------------------------------------------------


def _full_weights(kind: str, model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Gather the full fp32 weights on every rank (collective), to compare the loaders with."""
    if kind == "fsdp2":
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return {k: v.clone() for k, v in get_model_state_dict(model, options=options).items()}
    import deepspeed

    params = dict(model.named_parameters())
    with deepspeed.zero.GatheredParameters(list(params.values()), modifier_rank=None):
        return {name: p.detach().float().cpu().clone() for name, p in params.items()}


def _distributed_loop(config: dict) -> None:
    """Train and save each kind in turn on the same two workers, one report per kind."""
    for kind in config["kinds"]:
        _train_and_save(kind, Path(config["scratch"]) / kind)


def _train_and_save(kind: str, out_dir: Path) -> None:
    from ray.train.lightning import RayLightningEnvironment

    torch.manual_seed(0)
    if kind == "fsdp2":
        model, strategy = create_tiny_fsdp2_model(), RayModelParallelStrategy()
    else:
        model, strategy = create_tiny_model(), CpuDeepSpeedStrategy(stage=int(kind[-1]))
    trainer = pl.Trainer(
        accelerator="cpu",
        devices="auto",
        strategy=strategy,
        plugins=[RayLightningEnvironment()],
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, train_dataloaders=regression_loader())
    trainer.save_checkpoint(out_dir / cf.CHECKPOINT_NAME)
    reference = _full_weights(kind, model)
    if trainer.global_rank == 0:
        torch.save(reference, out_dir.parent / f"{kind}-reference.pt")
    trainer.strategy.barrier()
    ray.train.report({"kind": kind, "global_step": trainer.global_step},
                     checkpoint=Checkpoint.from_directory(str(out_dir)))


@pytest.fixture(scope="module")
def distributed_checkpoints(ray_cluster, tmp_path_factory):
    """``{kind: (ray_checkpoint_folder, reference_weights)}`` for fsdp2 and zero3.

    ZeRO-3 is the partitioned case (no rank holds whole parameters); ZeRO-2 goes through the
    same converter and is covered end to end in ``test_state_dict.py``. Both come from one
    Ray Train run on the same two workers, which keeps this module cheap on 2 shared cores.
    """
    from ray.train.torch import TorchTrainer

    root = tmp_path_factory.mktemp("distributed")
    kinds = ("fsdp2", "zero3")
    # One Ray Train run makes both (one report each): a run's start is most of its cost here.
    result = TorchTrainer(
        _distributed_loop,
        train_loop_config={"kinds": kinds, "scratch": str(root / "scratch")},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="ckpt-formats", storage_path=str(root / "storage")),
    ).fit()
    assert result.error is None
    folders = {metrics["kind"]: Path(checkpoint.path)
               for checkpoint, metrics in result.best_checkpoints}
    assert sorted(folders) == sorted(kinds)
    return {kind: (folders[kind], torch.load(root / "scratch" / f"{kind}-reference.pt",
                                              weights_only=True))
            for kind in kinds}


def test_fsdp2_dcp_folder_loads_full_weights_without_process_group(distributed_checkpoints):
    folder, reference = distributed_checkpoints["fsdp2"]
    entry = cf.resolve_checkpoint_entry(folder)
    assert entry.is_dir()
    assert cf.detect_format(entry) is CheckpointFormat.FSDP2_DCP
    assert not torch.distributed.is_initialized()
    _assert_same_weights(cf.load_fsdp2_dcp(entry), reference)
    _assert_same_weights(cf.load_state_dict(folder, "fsdp2"), reference)
    with pytest.raises(ValueError, match="single file"):
        cf.load_state_dict(folder, "ddp")


def test_deepspeed_zero3_folder_converts_to_fp32(distributed_checkpoints):
    folder, reference = distributed_checkpoints["zero3"]
    entry = cf.resolve_checkpoint_entry(folder)
    assert cf.detect_format(entry) is CheckpointFormat.DEEPSPEED_ZERO
    loaded = cf.load_state_dict(folder, "deepspeed")
    # DeepSpeed's "_forward_module." wrapper prefix is gone: LightningModule keys remain.
    assert all(not key.startswith("_forward_module.") for key in loaded)
    _assert_same_weights(loaded, reference)
    TinyRegressor().load_state_dict(loaded, strict=True)  # every key fits, nothing extra
    with pytest.raises(ValueError, match="DeepSpeed ZeRO"):
        cf.load_state_dict(folder, "fsdp2")


class _Hook:
    """An object whose unpickling runs code (what a tampered checkpoint would hold)."""

    ran = False

    def __reduce__(self):
        return (_Hook._run, ())

    @staticmethod
    def _run():
        _Hook.ran = True
        return "ran"


class _Config:
    """A user's hyperparameter object: harmless, but unknown to torch's safe loader."""

    def __init__(self, width: int = 8) -> None:
        self.width = width


def test_full_file_loads_without_running_pickled_code(full_file_run, tmp_path):
    folder, reference = full_file_run
    checkpoint = torch.load(folder / cf.CHECKPOINT_NAME, weights_only=True)
    # A checkpoint Lightning wrote (loops, callbacks, optimizer) loads with the safe loader.
    _assert_same_weights(cf.load_full_file(folder / cf.CHECKPOINT_NAME), reference)

    tampered = tmp_path / "tampered.ckpt"
    torch.save({**checkpoint, "extra": _Hook()}, tampered)
    with pytest.raises(ValueError, match=r"safe loader does not allow.*_Hook") as info:
        cf.load_full_file(tampered)
    assert "add_safe_globals" in str(info.value)
    assert not _Hook.ran

    configured = tmp_path / "configured.ckpt"
    torch.save({**checkpoint, "hyper_parameters": {"config": _Config()}}, configured)
    with pytest.raises(ValueError, match="_Config"):
        cf.load_full_file(configured)
    with torch.serialization.safe_globals([_Config]):  # the user's allow-list
        _assert_same_weights(cf.load_full_file(configured), reference)
