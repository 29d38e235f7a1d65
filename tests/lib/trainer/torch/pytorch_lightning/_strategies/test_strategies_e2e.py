"""Strategies through LightningTrainer on real GPU workers: FSDP1, DeepSpeed, fp16 DDP."""

from __future__ import annotations

import os

import pytest
import torch
from _models import (
    create_tiny_model,
    make_regression_datasets,
    ship_by_value,
)
from ray.train import RunConfig, ScalingConfig

from michelangelo.lib.trainer.torch.pytorch_lightning import (
    LightningTrainer,
    LightningTrainerParam,
)

ship_by_value(__name__)


pytestmark = pytest.mark.usefixtures("ray_cluster")


def _run(tmp_path, name, factory, strategy, use_gpu=False, **extra):
    # One worker per GPU, at most 2, so a one-GPU machine runs the GPU cases too (two GPU
    # workers would not fit). 16 rows per worker keep 2 steps at the default batch size 8.
    workers = min(2, torch.cuda.device_count()) if use_gpu else 2
    train, val = make_regression_datasets(16 * workers, 8)
    return LightningTrainer(
        trainer_param=LightningTrainerParam(
            create_model_fn=factory, create_model_fn_kwargs={}, train_data=train,
            val_data=val, lightning_trainer_kwargs={"strategy": strategy, **extra}),
        run_config=RunConfig(name=name, storage_path=str(tmp_path / "ray")),
        scaling_config=ScalingConfig(num_workers=workers, use_gpu=use_gpu),
    ).train()


# FSDP2 on CPU is trained end to end in test_state_dict.py and test_fsdp2.py.


gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.gpu
@gpu
def test_fsdp_on_gpu(tmp_path):
    result = _run(tmp_path, "fsdp", create_tiny_model, "fsdp", use_gpu=True,
                  precision="bf16-mixed")
    assert os.path.exists(os.path.join(result["checkpoint_path"], "checkpoint.ckpt"))


@pytest.mark.gpu
@gpu
def test_deepspeed_on_gpu(tmp_path):
    result = _run(tmp_path, "deepspeed", create_tiny_model, "deepspeed", use_gpu=True,
                  precision="bf16-mixed", strategy_kwargs={"stage": 2})
    assert os.path.isdir(os.path.join(result["checkpoint_path"], "checkpoint.ckpt"))


@pytest.mark.gpu
@gpu
def test_fp16_ddp_on_gpu(tmp_path):
    result = _run(tmp_path, "fp16", create_tiny_model, "ddp", use_gpu=True,
                  precision="16-mixed")
    assert result["metrics"]["step"] == 2
