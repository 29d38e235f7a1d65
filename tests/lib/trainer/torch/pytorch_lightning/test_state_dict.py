"""End-to-end tests for ``LightningTrainerWithStateDict.update_model_state_dict``.

Each run trains through the real trainer on two Ray Train workers, then loads the weights into a
fresh model. The expected weights come from an independent reader of the same checkpoint
(``torch.load`` for a file, torch's ``dcp_to_torch_save`` for DCP, Lightning's ZeRO converter
for DeepSpeed), not from the loaders under test.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
import torch
from _cpu_deepspeed import DEEPSPEED_CPU_ENV, CpuDeepSpeedStrategy
from _models import (
    ISOLATED_STATE_API,
    TinyRegressor,
    create_tiny_fsdp2_model,
    create_tiny_model,
    make_regression_datasets,
    ship_by_value,
)
from ray.train import RunConfig, ScalingConfig

from michelangelo.lib.model_registry import ModelRegistry
from michelangelo.lib.trainer.torch.pytorch_lightning import (
    LightningTrainerParam,
    LightningTrainerWithStateDict,
    ModelSpec,
    TransferLearningMetadata,
    TransferLearningSpec,
)

ship_by_value(__name__)

LOGGER = "michelangelo.lib.trainer.torch.pytorch_lightning._state_dict"


RAY_ENV_VARS = {**ISOLATED_STATE_API, **DEEPSPEED_CPU_ENV}


def _trainer(tmp_path: Path, name: str, create_model_fn, strategy, use_gpu: bool = False,
             num_workers: int = 2, transfer=None, **extra_kwargs
             ) -> LightningTrainerWithStateDict:
    train, val = make_regression_datasets(n_rows=128)
    kwargs = {"max_epochs": 1, **extra_kwargs}
    if strategy is not None:
        kwargs["strategy"] = strategy
    return LightningTrainerWithStateDict(
        trainer_param=LightningTrainerParam(
            create_model_fn=create_model_fn,
            create_model_fn_kwargs={"hidden_dim": 8},
            train_data=train,
            val_data=val,
            batch_size=8,
            lightning_trainer_kwargs=kwargs,
            transfer_learning_spec=transfer,
        ),
        run_config=RunConfig(name=name, storage_path=str(tmp_path / "storage")),
        scaling_config=ScalingConfig(num_workers=num_workers, use_gpu=use_gpu),
    )


def _assert_loaded(model: torch.nn.Module, expected: dict[str, torch.Tensor]) -> None:
    actual = model.state_dict()
    assert sorted(actual) == sorted(expected)
    for key, value in expected.items():
        torch.testing.assert_close(actual[key], value.to(actual[key].dtype), msg=key)


def _fresh_differs(expected: dict[str, torch.Tensor]) -> None:
    # Guard against a vacuous pass: an untouched model must not already hold these weights.
    fresh = TinyRegressor(hidden_dim=8).state_dict()
    assert any(not torch.equal(fresh[k], expected[k]) for k in expected)


def test_update_before_train_is_a_value_error(ray_cluster, tmp_path):
    trainer = _trainer(tmp_path, "never-trained", create_tiny_model, None)
    with pytest.raises(ValueError, match="before train"):
        trainer.update_model_state_dict(TinyRegressor())


def test_ddp_checkpoint_loads_into_lightning_module_and_inner_module(ray_cluster, tmp_path, caplog):
    trainer = _trainer(tmp_path, "sd-ddp", create_tiny_model, "ddp")
    result = trainer.train()
    assert trainer.train_result is result
    ckpt_file = Path(result["checkpoint_path"]) / "checkpoint.ckpt"
    assert ckpt_file.is_file()
    expected = torch.load(ckpt_file, map_location="cpu", weights_only=False)["state_dict"]
    _fresh_differs(expected)

    model = TinyRegressor(hidden_dim=8)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        trainer.update_model_state_dict(model)
    _assert_loaded(model, expected)
    lines = [r for r in caplog.records if r.name == LOGGER]
    assert len(lines) == 1
    assert "missing keys: []; unexpected keys: []" in lines[0].getMessage()

    # The plain module inside the LightningModule: the "net." attribute prefix is removed.
    inner = TinyRegressor.build_net(8)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=LOGGER):
        trainer.update_model_state_dict(inner)
    _assert_loaded(inner, {k.removeprefix("net."): v for k, v in expected.items()})
    assert "removed prefix='net.'" in caplog.records[-1].getMessage()

    # A model covering only part of the checkpoint: loads what matches, logs the rest.
    partial = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1),
                                  torch.nn.Linear(2, 2))
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=LOGGER):
        trainer.update_model_state_dict(partial)
    message = [r for r in caplog.records if r.name == LOGGER][-1]
    assert message.levelno == logging.WARNING
    assert "missing keys: ['3.weight', '3.bias']" in message.getMessage()
    torch.testing.assert_close(partial[0].weight, expected["net.0.weight"])


def test_fsdp2_distributed_checkpoint_loads_full_weights(ray_cluster, tmp_path, monkeypatch):
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    # The FSDP2 model is written as Lightning documents it: plain layers from __init__,
    # sharded in configure_model() over self.device_mesh. Inheriting and freezing apply to
    # the plain layers before the sharding; the checkpoint shows they did.
    monkeypatch.setenv("MA_MODEL_REGISTRY_URL", str(tmp_path / "registry"))
    torch.manual_seed(11)
    baseline = TinyRegressor(hidden_dim=8).state_dict()
    ModelRegistry().register("p", "base", state_dict=baseline)
    transfer = TransferLearningSpec(
        metadata=TransferLearningMetadata(baseline_model=ModelSpec("p", "base", 1)),
        layer_names_to_inherit=["net.0"], layer_names_to_freeze=["net.0"])
    trainer = _trainer(tmp_path, "sd-fsdp2", create_tiny_fsdp2_model, "fsdp2",
                       transfer=transfer)
    result = trainer.train()
    # FSDP2 on CPU workers (no prepare_trainer) writes a distributed (DCP) checkpoint: a
    # folder with one shard per rank.
    dcp_dir = Path(result["checkpoint_path"]) / "checkpoint.ckpt"
    assert dcp_dir.is_dir()
    assert sum(name.endswith(".distcp") for name in os.listdir(dcp_dir)) == 2
    dcp_to_torch_save(dcp_dir, tmp_path / "converted.pt")
    expected = torch.load(tmp_path / "converted.pt", weights_only=False)["state_dict"]
    _fresh_differs(expected)
    for key in ("net.0.weight", "net.0.bias"):  # inherited, frozen: still the baseline's
        assert torch.equal(expected[key], baseline[key]), key
    for key in ("net.2.weight", "net.2.bias"):  # trained from the model's own init
        assert not torch.equal(expected[key], baseline[key]), key

    model = TinyRegressor(hidden_dim=8)
    trainer.update_model_state_dict(model)
    _assert_loaded(model, expected)


# ZeRO-2 here; the partitioned ZeRO-3 folder goes through the same converter in
# test_checkpoint_formats.py, which already trains one.
@pytest.mark.parametrize("stage", [2])
def test_deepspeed_zero_checkpoint_loads_as_fp32(ray_cluster, tmp_path, stage):
    from pytorch_lightning.utilities.deepspeed import convert_zero_checkpoint_to_fp32_state_dict

    trainer = _trainer(tmp_path, f"sd-zero{stage}", create_tiny_model,
                       CpuDeepSpeedStrategy(stage=stage))
    result = trainer.train()
    zero_dir = Path(result["checkpoint_path"]) / "checkpoint.ckpt"
    assert (zero_dir / "latest").is_file()
    converted = convert_zero_checkpoint_to_fp32_state_dict(zero_dir, tmp_path / "fp32.ckpt")
    expected = converted["state_dict"]
    _fresh_differs(expected)

    model = TinyRegressor(hidden_dim=8)
    trainer.update_model_state_dict(model)
    _assert_loaded(model, expected)


# ---------------------------------------------------------------------------------------------
# FSDP1: Lightning refuses "fsdp" without a GPU, so these run in bench/gpu_check.sh.
# ---------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="FSDP1 needs CUDA GPUs")
@pytest.mark.parametrize("state_dict_type", ["full", "sharded"])
def test_fsdp1_checkpoint_loads_on_gpu(ray_cluster, tmp_path, state_dict_type):
    # Two workers where two GPUs exist; one GPU still writes both FSDP1 formats. ray.init
    # without num_gpus detects the GPUs.
    workers = min(2, torch.cuda.device_count())
    trainer = _trainer(tmp_path, f"sd-fsdp1-{state_dict_type}", create_tiny_model, "fsdp",
                       use_gpu=True, num_workers=workers,
                       strategy_kwargs={"state_dict_type": state_dict_type})
    result = trainer.train()
    entry = Path(result["checkpoint_path"]) / "checkpoint.ckpt"
    if state_dict_type == "full":
        assert entry.is_file()
        expected = torch.load(entry, map_location="cpu", weights_only=False)["state_dict"]
    else:
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

        assert entry.is_dir()
        dcp_to_torch_save(entry, tmp_path / "converted.pt")
        expected = torch.load(tmp_path / "converted.pt", weights_only=False)["model"]
    _fresh_differs(expected)
    model = TinyRegressor(hidden_dim=8)
    trainer.update_model_state_dict(model)
    _assert_loaded(model, expected)
