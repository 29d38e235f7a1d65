"""Memory preflight: meta-device parameter count against the worker's memory."""

from __future__ import annotations

import warnings

import pytest
import pytorch_lightning as pl
import torch
from _models import create_tiny_model
from ray.train import RunConfig, ScalingConfig

from michelangelo.lib.trainer.torch.pytorch_lightning import (
    LightningTrainer,
    LightningTrainerParam,
)
from michelangelo.lib.trainer.torch.pytorch_lightning._config._preflight import (
    build_meta_model,
    cannot_build_here,
    check_memory,
    count_meta_parameters,
    estimate_bytes,
)
from michelangelo.lib.trainer.torch.pytorch_lightning._strategies._registry import choose_strategy
from michelangelo.uniflow.plugins.ray import RayTask
from michelangelo.uniflow.plugins.ray._capacity._shapes import active_ray_task

RAY_NUM_CPUS = 2


def tiny_params(hidden_dim):
    return count_meta_parameters(create_tiny_model(hidden_dim=hidden_dim))


def test_meta_build_counts_without_allocating():
    model = build_meta_model(create_tiny_model, {"hidden_dim": 1000})
    assert next(model.parameters()).is_meta
    assert count_meta_parameters(model) == 8 * 1000 + 1000 + 1000 + 1


def test_factory_that_cannot_build_on_meta_is_skipped(caplog):
    def loads_a_file():
        raise FileNotFoundError("weights.bin")

    with caplog.at_level("DEBUG"):
        assert build_meta_model(loads_a_file, {}) is None
    assert "preflight skipped" in caplog.text


def test_estimates_per_strategy():
    n = 1_000_000
    assert estimate_bytes(n, choose_strategy("ddp", None), 4) == 16 * n
    assert estimate_bytes(n, choose_strategy("fsdp", None), 4) == 4 * n
    assert estimate_bytes(n, choose_strategy("fsdp2", None), 4) == 4 * n
    assert estimate_bytes(n, choose_strategy("deepspeed", {"stage": 3}), 4) == 4 * n
    assert estimate_bytes(n, choose_strategy("deepspeed", {"stage": 2}), 4) == 7 * n
    assert estimate_bytes(n, choose_strategy("deepspeed", {"stage": 1}), 4) == 10 * n


def test_warns_above_80_percent_and_raises_above_100():
    ddp = choose_strategy("ddp", None)
    params = 1_000_000  # 16 MB of persistent state under DDP
    scaling = ScalingConfig(num_workers=2, resources_per_worker={"memory": 18_000_000})
    with pytest.warns(UserWarning, match="little room is left"):
        estimate = check_memory(params, ddp, scaling)
    assert estimate.per_worker_bytes == 16_000_000
    small = ScalingConfig(num_workers=2, resources_per_worker={"memory": 10_000_000})
    with pytest.raises(ValueError, match="Memory preflight.*Fix: raise worker_memory"):
        check_memory(params, ddp, small)
    # Sharding over 2 workers halves it: fits comfortably.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_memory(params, choose_strategy("fsdp", None), ScalingConfig(
            num_workers=2, resources_per_worker={"memory": 20_000_000}))


def test_no_declared_memory_skips():
    assert check_memory(10**12, choose_strategy("ddp", None), ScalingConfig(num_workers=2)) is None


def test_raytask_worker_memory_is_the_budget_and_the_trainer_refuses(data, tmp_path):
    train, val = data
    hidden = 22_000
    params = tiny_params(hidden)  # ~220k parameters -> ~3.5 MB under DDP
    task = RayTask(worker_memory="2Mi", worker_instances=2)
    with active_ray_task(task), pytest.raises(ValueError) as info:
        LightningTrainer(
            trainer_param=LightningTrainerParam(
                create_model_fn=create_tiny_model, create_model_fn_kwargs={"hidden_dim": hidden},
                train_data=train, val_data=val),
            run_config=RunConfig(name="oom", storage_path=str(tmp_path)),
            scaling_config=ScalingConfig(num_workers=2),
        )
    assert f"{params:,} parameters" in str(info.value)
    assert "RayTask worker_memory" in str(info.value)
    # The same model sharded with fsdp over the 2 workers fits the same task (1.76 MB, 84% of 2 MiB),
    # though close enough to warn.
    with active_ray_task(task), pytest.warns(UserWarning, match="Memory preflight"):
        fits = LightningTrainer(
            trainer_param=LightningTrainerParam(
                create_model_fn=create_tiny_model, create_model_fn_kwargs={"hidden_dim": hidden},
                train_data=train, val_data=val,
                lightning_trainer_kwargs={"strategy": "fsdp"}),
            run_config=RunConfig(name="fits", storage_path=str(tmp_path)),
            scaling_config=ScalingConfig(num_workers=2),
        )
    # The figures stay readable on the trainer (the GPT example prints them).
    estimate = fits.memory_estimate
    assert estimate.parameters == params and estimate.budget_bytes == 2 * 2**20
    assert 0.8 < estimate.fraction < 1.0


class _MetaItemModel(pl.LightningModule):
    """Reads a value out of a freshly initialised weight, which a meta tensor cannot give."""

    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(8, 1)
        self.scale = float(self.net.weight.abs().max().item())


def _reads_meta_data():
    return _MetaItemModel()


def _needs_cuda():
    return create_tiny_model().to("cuda")


def _needs_worker_package():
    import michelangelo_package_only_on_workers  # noqa: F401

    return create_tiny_model()


@pytest.mark.parametrize("factory", [_reads_meta_data, _needs_cuda, _needs_worker_package],
                         ids=["meta-item", "cuda", "missing-package"])
def test_cannot_build_here_is_skipped_quietly(factory, caplog):
    with caplog.at_level("DEBUG"):
        assert build_meta_model(factory, {}) is None
    assert "preflight skipped" in caplog.text


def _buggy_factory(hidden_dim=8):
    layers = {"in": torch.nn.Linear(8, hidden_dim)}
    return layers["out"]  # KeyError: the factory's own bug


def test_real_factory_errors_surface_with_the_original_chained():
    with pytest.raises(ValueError) as info:
        build_meta_model(_buggy_factory, {"hidden_dim": 4})
    assert "_buggy_factory(**create_model_fn_kwargs) raised KeyError" in str(info.value)
    assert "Fix" in str(info.value)
    assert isinstance(info.value.__cause__, KeyError)


def test_factory_must_return_a_lightning_module():
    with pytest.raises(ValueError, match="returned Linear, not a LightningModule"):
        build_meta_model(lambda: torch.nn.Linear(2, 2), {})


def test_cannot_build_here_follows_the_cause_chain():
    try:
        try:
            torch.zeros(1, device="meta").item()
        except RuntimeError as inner:
            raise ValueError("could not initialise the head") from inner
    except ValueError as outer:
        assert cannot_build_here(outer)
    assert not cannot_build_here(ValueError("metadata key missing"))
    assert cannot_build_here(FileNotFoundError("weights.bin"))
