"""The documented-pattern corpus (``_documented_models``) through ``LightningTrainer``.

Each module uses what only the distributed run has, where Lightning's docs use it. The driver
must accept every one of them (its meta builds skip a hook that cannot run there and leave
the decisions that hook fed to the workers), and each must train on two CPU workers with the
strategies it fits: ddp, fsdp2 and DeepSpeed (on CPU through the test strategy in
``_cpu_deepspeed``). FSDP1 needs a GPU in Lightning; the GPU check covers it.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from _cpu_deepspeed import DEEPSPEED_CPU_ENV, CpuDeepSpeedStrategy
from _documented_models import (
    create_mistyped,
    create_one_cycle,
    create_rank_zero_printing,
    create_sharded_in_configure,
    create_trainer_sized,
)
from _models import ISOLATED_STATE_API, TinyRegressor, make_regression_datasets, ship_by_value
from ray.train import RunConfig, ScalingConfig

from michelangelo.lib.model_registry import ModelRegistry
from michelangelo.lib.trainer.torch.pytorch_lightning import (
    IncrementalTrainingSpec,
    LearningMode,
    LightningTrainer,
    LightningTrainerParam,
    LightningTrainerWithStateDict,
    ModelSpec,
    TransferLearningMetadata,
    TransferLearningSpec,
)

ship_by_value(__name__)

PREFLIGHT_LOGGER = "michelangelo.lib.trainer.torch.pytorch_lightning._config._preflight"


RAY_ENV_VARS = {**ISOLATED_STATE_API, **DEEPSPEED_CPU_ENV}


@pytest.fixture
def registry(tmp_path, monkeypatch):
    monkeypatch.setenv("MA_MODEL_REGISTRY_URL", str(tmp_path / "registry"))
    return ModelRegistry()


def _trainer(tmp_path: Path, name: str, factory, strategy, *, lr: float = 1e-2,
             transfer=None, incremental=None, max_epochs: int = 1, memory: int | None = None
             ) -> LightningTrainerWithStateDict:
    train, val = make_regression_datasets(64, 16)
    resources = {"CPU": 1, "memory": memory} if memory else None
    return LightningTrainerWithStateDict(
        trainer_param=LightningTrainerParam(
            create_model_fn=factory, create_model_fn_kwargs={"hidden_dim": 8, "lr": lr},
            train_data=train, val_data=val, batch_size=8,
            lightning_trainer_kwargs={"max_epochs": max_epochs, "strategy": strategy},
            transfer_learning_spec=transfer, incremental_training_spec=incremental),
        run_config=RunConfig(name=name, storage_path=str(tmp_path / "ray")),
        scaling_config=ScalingConfig(num_workers=2, resources_per_worker=resources),
    )


def _seeded_baseline(registry: ModelRegistry, seed: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    weights = TinyRegressor(hidden_dim=8).state_dict()
    registry.register("p", "base", state_dict=weights)
    return weights


def _metadata(learning_mode=None) -> TransferLearningMetadata:
    kwargs = {"learning_mode": learning_mode} if learning_mode is not None else {}
    return TransferLearningMetadata(baseline_model=ModelSpec("p", "base", 1), **kwargs)


def test_the_driver_accepts_every_documented_module(ray_cluster, caplog):
    """No worker starts here: the constructor's meta builds alone must not refuse them."""
    train, val = make_regression_datasets(16, 8)
    factories = [create_sharded_in_configure, create_trainer_sized, create_one_cycle,
                 create_rank_zero_printing]
    with caplog.at_level(logging.DEBUG, logger=PREFLIGHT_LOGGER):
        for factory in factories:
            strategy = "fsdp2" if factory is create_sharded_in_configure else "ddp"
            LightningTrainer(
                trainer_param=LightningTrainerParam(
                    create_model_fn=factory, create_model_fn_kwargs={},
                    train_data=train, val_data=val,
                    lightning_trainer_kwargs={"strategy": strategy}),
                scaling_config=ScalingConfig(num_workers=2))
    skipped = [r.getMessage() for r in caplog.records
               if "did not run on the driver" in r.getMessage()]
    # The two hooks that read the device mesh or the trainer; the others have none.
    assert len(skipped) == 2
    assert "ShardedInConfigureModel.configure_model()" in skipped[0]
    assert "TrainerSizedModel.configure_model()" in skipped[1]


def test_fsdp2_layers_built_in_configure_model_inherit_freeze_and_check_memory_on_workers(
        ray_cluster, registry, tmp_path):
    """Warm start, freeze and the memory preflight are all decided after configure_model()."""
    baseline = _seeded_baseline(registry, seed=21)
    transfer = TransferLearningSpec(metadata=_metadata(), layer_names_to_inherit=["net.2"],
                                    layer_names_to_freeze=["net.2"])
    trainer = _trainer(tmp_path, "lazy-fsdp2", create_sharded_in_configure, "fsdp2",
                       transfer=transfer, memory=2**30)
    assert trainer.memory_estimate is None  # moved to the workers
    trainer.train()
    model = TinyRegressor(hidden_dim=8)
    trainer.update_model_state_dict(model)
    trained = model.state_dict()
    for key in ("net.2.weight", "net.2.bias"):  # inherited, then frozen
        assert torch.equal(trained[key], baseline[key]), key
    assert not torch.equal(trained["net.0.weight"], baseline["net.0.weight"])


def test_fsdp2_memory_preflight_on_workers_refuses_a_model_that_cannot_fit(
        ray_cluster, tmp_path):
    # 81 parameters x 16 bytes / 2 workers is about 650 bytes: a 600-byte budget is too small.
    trainer = _trainer(tmp_path, "lazy-fsdp2-oom", create_sharded_in_configure, "fsdp2",
                       memory=600)
    with pytest.raises(Exception, match=r"(?s)Memory preflight.*81 parameters"):
        trainer.train()


@pytest.mark.parametrize("strategy", ["ddp", "deepspeed"])
def test_configure_model_reading_the_trainer_continues_a_revision(
        ray_cluster, registry, tmp_path, strategy):
    """Incremental training into layers configure_model() creates: placed by the workers.

    With a learning rate of zero the trained weights are exactly the ones loaded, so equality
    shows the revision went into the layers the hook built.
    """
    baseline = _seeded_baseline(registry, seed=7)
    incremental = IncrementalTrainingSpec(
        metadata=_metadata(LearningMode.INCREMENTAL_TRAINING))
    chosen = CpuDeepSpeedStrategy(stage=2) if strategy == "deepspeed" else strategy
    trainer = _trainer(tmp_path, f"sized-{strategy}", create_trainer_sized, chosen, lr=0.0,
                       incremental=incremental)
    result = trainer.train()
    assert result["metrics"]["epoch"] == 0
    model = TinyRegressor(hidden_dim=8)
    trainer.update_model_state_dict(model)
    for key, value in baseline.items():
        torch.testing.assert_close(model.state_dict()[key], value, msg=key)


@pytest.mark.parametrize("strategy", ["ddp", "deepspeed"])
def test_one_cycle_schedule_sized_by_estimated_stepping_batches(ray_cluster, tmp_path,
                                                                 strategy):
    chosen = CpuDeepSpeedStrategy(stage=2) if strategy == "deepspeed" else strategy
    result = _trainer(tmp_path, f"onecycle-{strategy}", create_one_cycle, chosen,
                      max_epochs=2).train()
    # 64 rows over 2 workers in batches of 8: 4 optimizer steps an epoch. OneCycleLR raises
    # once it is stepped past total_steps, so finishing shows the estimate was right.
    assert result["metrics"]["step"] == 8


def test_rank_zero_printing_module_trains(ray_cluster, tmp_path):
    result = _trainer(tmp_path, "rank-zero", create_rank_zero_printing, "ddp").train()
    assert result["metrics"]["step"] == 4
    assert result["metrics"]["val_loss"] > 0


def test_a_genuine_error_in_configure_model_names_the_hook(ray_cluster, tmp_path):
    trainer = _trainer(tmp_path, "mistyped", create_mistyped, "ddp")  # the driver accepts it
    with pytest.raises(Exception) as info:
        trainer.train()
    text = str(info.value)
    assert "MistypedConfigureModel.configure_model() raised AttributeError" in text
    assert "hiden_dim" in text
    assert "create_model_fn" not in text
