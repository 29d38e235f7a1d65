"""Tests for ``_fsdp2``: driver-side kwarg checks and FSDP2 on two real Ray Train workers (gloo)."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest
import ray
import torch
from _models import ISOLATED_STATE_API, create_tiny_fsdp2_model, regression_loader, ship_by_value
from ray.train import Checkpoint, RunConfig, ScalingConfig

from michelangelo.lib.trainer.torch.pytorch_lightning._strategies._fsdp2 import (
    RayModelParallelStrategy,
    validate_fsdp2_kwargs,
)

ship_by_value(__name__)

RAY_ENV_VARS = ISOLATED_STATE_API  # Ray Train runs below; see _models.ISOLATED_STATE_API


# ---------------------------------------------------------------------------------------------
# validate_fsdp2_kwargs (driver side, no Ray)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value", "fix_hint"),
    [
        ("tensor_parallel_size", 2, "remove it"),
        ("data_parallel_size", 4, "ScalingConfig(num_workers"),
        ("process_group_backend", "nccl", "TorchConfig(backend"),
        ("timeout", 30, "TorchConfig(timeout_s"),
    ],
)
def test_ray_owned_kwargs_are_rejected_with_key_value_and_fix(key, value, fix_hint):
    with pytest.raises(ValueError) as info:
        validate_fsdp2_kwargs({key: value, "cpu_offload": False})
    message = str(info.value)
    assert repr(key) in message
    assert repr(value) in message
    assert "fsdp2" in message
    assert fix_hint in message


def test_save_distributed_checkpoint_false_is_forced_back_with_warning():
    given = {"save_distributed_checkpoint": False, "some_option": 1}
    with pytest.warns(UserWarning, match="save_distributed_checkpoint"):
        cleaned = validate_fsdp2_kwargs(given)
    assert cleaned == {"save_distributed_checkpoint": True, "some_option": 1}
    assert given["save_distributed_checkpoint"] is False  # input left alone


def test_clean_kwargs_pass_without_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert validate_fsdp2_kwargs(None) == {"save_distributed_checkpoint": True}
        assert validate_fsdp2_kwargs({"save_distributed_checkpoint": True}) == {
            "save_distributed_checkpoint": True
        }


def test_non_dict_kwargs_are_a_type_error():
    with pytest.raises(TypeError, match="strategy_kwargs"):
        validate_fsdp2_kwargs([("timeout", 1)])  # type: ignore[arg-type]


def test_the_cluster_environment_is_always_rays():
    from pytorch_lightning.plugins.environments import KubeflowEnvironment, LightningEnvironment

    from michelangelo.lib.trainer.torch.pytorch_lightning._strategies import ray_lightning

    ray_environment = ray_lightning().environment
    strategy = RayModelParallelStrategy()
    # None until the Trainer hands one over, so Ray's given as a plugin too is no conflict.
    assert strategy.cluster_environment is None
    given = ray_environment()
    strategy.cluster_environment = given
    assert strategy.cluster_environment is given
    # Lightning's own choices (its default; Kubeflow's on a Kubernetes pod) give way to Ray's.
    for lightning_choice in (LightningEnvironment(), KubeflowEnvironment()):
        strategy.cluster_environment = lightning_choice
        assert type(strategy.cluster_environment) is ray_environment


def test_strategy_constructor_applies_the_same_checks():
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        RayModelParallelStrategy(tensor_parallel_size=2)
    strategy = RayModelParallelStrategy()
    assert strategy._save_distributed_checkpoint is True


# ---------------------------------------------------------------------------------------------
# FSDP2 on two Ray Train workers
# ---------------------------------------------------------------------------------------------


def _fsdp2_loop(config: dict) -> None:
    """Ray Train worker loop: fit an FSDP2 module, save a DCP checkpoint, report it."""
    import pytorch_lightning as pl
    from ray.train.lightning import RayLightningEnvironment

    ctx = ray.train.get_context()
    loader = regression_loader(64)
    model = create_tiny_fsdp2_model(hidden_dim=8)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices="auto",
        strategy=RayModelParallelStrategy(),
        plugins=[RayLightningEnvironment()],
        max_epochs=config["max_epochs"],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
    )
    resume_from = None
    ray_checkpoint = ray.train.get_checkpoint()
    if ray_checkpoint is not None:
        resume_from = str(Path(ray_checkpoint.path) / "checkpoint.ckpt")
    trainer.fit(model, train_dataloaders=loader, ckpt_path=resume_from)

    strategy = trainer.strategy
    # Every rank writes its shard into the same directory (one host here), named by the run so
    # it does not depend on the rank; the broadcast inside save_checkpoint enforces that anyway.
    out_dir = Path(config["scratch"]) / f"epoch{trainer.current_epoch}"
    trainer.save_checkpoint(out_dir / "checkpoint.ckpt")
    strategy.barrier()
    shard_sizes = {
        type(p).__name__: tuple(p.to_local().shape) if hasattr(p, "to_local") else tuple(p.shape)
        for p in model.parameters()
    }
    ray.train.report(
        {
            "global_step": trainer.global_step,
            "rank": ctx.get_world_rank(),
            "dp_size": strategy.device_mesh["data_parallel"].size(),
            "backend": torch.distributed.get_backend(),
            "first_local_shape": list(next(iter(shard_sizes.values()))),
        },
        checkpoint=Checkpoint.from_directory(str(out_dir)),
    )


def _run(tmp_path: Path, name: str, max_epochs: int):
    from ray.train.torch import TorchTrainer

    trainer = TorchTrainer(
        _fsdp2_loop,
        train_loop_config={"max_epochs": max_epochs, "scratch": str(tmp_path / "scratch")},
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
        run_config=RunConfig(name=name, storage_path=str(tmp_path / "storage")),
    )
    return trainer.fit()


def test_fsdp2_trains_saves_dcp_and_resumes_on_two_ray_workers(ray_cluster, tmp_path):
    first = _run(tmp_path, "fsdp2-run", max_epochs=1)
    assert first.error is None
    assert first.metrics["dp_size"] == 2
    assert first.metrics["backend"] == "gloo"
    # 64 rows / 2 ranks / batch 8 = 4 optimizer steps per epoch.
    assert first.metrics["global_step"] == 4
    ckpt = Path(first.checkpoint.path) / "checkpoint.ckpt"
    assert ckpt.is_dir()
    names = sorted(os.listdir(ckpt))
    assert ".metadata" in names and "meta.pt" in names
    assert sum(name.endswith(".distcp") for name in names) == 2  # one shard per rank

    # Same storage_path/name: Ray hands the checkpoint back and Lightning resumes the loops.
    second = _run(tmp_path, "fsdp2-run", max_epochs=2)
    assert second.error is None
    assert second.metrics["global_step"] == 8
    meta_path = Path(second.checkpoint.path) / "checkpoint.ckpt" / "meta.pt"
    meta = torch.load(meta_path, weights_only=False)
    assert meta["epoch"] == 2  # saved after fit(), so the loop already counts both epochs
    assert meta["global_step"] == 8
