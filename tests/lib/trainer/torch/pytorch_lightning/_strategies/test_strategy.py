"""Strategy strings resolve to Ray-aware strategies on the driver; anything else fails."""

from __future__ import annotations

import pytest
from pytorch_lightning.strategies import DDPStrategy
from ray.train.lightning import RayDDPStrategy, RayDeepSpeedStrategy, RayFSDPStrategy

from michelangelo.lib.trainer.torch.pytorch_lightning import RayModelParallelStrategy
from michelangelo.lib.trainer.torch.pytorch_lightning._strategies._registry import (
    choose_strategy,
    strategy_names,
)


@pytest.mark.parametrize(
    ("name", "cls", "prepared"),
    [
        (None, RayDDPStrategy, True),
        ("ddp", RayDDPStrategy, True),
        ("DDP", RayDDPStrategy, True),
        ("fsdp", RayFSDPStrategy, True),
        ("fsdp2", RayModelParallelStrategy, False),
        ("deepspeed", RayDeepSpeedStrategy, True),
    ],
)
def test_strings_resolve(name, cls, prepared):
    choice = choose_strategy(name, None)
    from michelangelo.lib.trainer.torch.pytorch_lightning._strategies._registry import _REGISTRY

    assert _REGISTRY[choice.name].load("pytorch_lightning") is cls
    assert choice.ray_prepared is prepared


def test_ddp_builds_with_kwargs():
    strategy = choose_strategy("ddp", {"find_unused_parameters": True}).build()
    assert isinstance(strategy, RayDDPStrategy)
    assert strategy._ddp_kwargs == {"find_unused_parameters": True}


def test_instance_passes_through():
    instance = RayDDPStrategy()
    choice = choose_strategy(instance, None)
    assert choice.build() is instance and choice.ray_prepared
    plain = choose_strategy(DDPStrategy(), None)
    assert not plain.ray_prepared and plain.label == "DDPStrategy"


@pytest.mark.parametrize("bad", ["ddp_spawn", "auto", "", 3, ["ddp"]])
def test_anything_else_is_a_value_error(bad):
    with pytest.raises(ValueError, match=r"lightning_trainer_kwargs\['strategy'\]=") as info:
        choose_strategy(bad, None)
    for name in strategy_names():
        assert name in str(info.value)


def test_kwargs_with_an_instance_are_rejected():
    with pytest.raises(ValueError, match="cannot be combined with a strategy instance"):
        choose_strategy(RayDDPStrategy(), {"find_unused_parameters": True})


def test_unknown_kwargs_rejected_when_checkable():
    # DeepSpeedStrategy has a closed signature (DDP forwards **kwargs to torch, unchecked).
    with pytest.raises(ValueError, match=r"\['bogus'\].*strategy='deepspeed'"):
        choose_strategy("deepspeed", {"bogus": 1})
    choose_strategy("deepspeed", {"stage": 3})


@pytest.mark.parametrize("key", ["tensor_parallel_size", "data_parallel_size",
                                 "process_group_backend", "timeout"])
def test_fsdp2_forbidden_kwargs(key):
    with pytest.raises(ValueError, match=key):
        choose_strategy("fsdp2", {key: 1})


def test_fsdp2_distributed_checkpoint_forced_back_with_warning():
    with pytest.warns(UserWarning, match="save_distributed_checkpoint"):
        choice = choose_strategy("fsdp2", {"save_distributed_checkpoint": False})
    assert choice.kwargs["save_distributed_checkpoint"] is True


def test_a_strategy_registers_itself_with_whether_it_shards(monkeypatch):
    from pytorch_lightning.strategies import FSDPStrategy

    from michelangelo.lib.trainer.torch.pytorch_lightning._strategies import _registry

    monkeypatch.setattr(_registry, "_REGISTRY", dict(_registry._REGISTRY))

    class TeamDDP(DDPStrategy):
        pass

    _registry.register_strategy("team-ddp", lambda package: TeamDDP, ray_prepared=False)
    choice = choose_strategy("team-ddp", {"find_unused_parameters": True})
    assert "team-ddp" in strategy_names()
    assert isinstance(choice.build(), TeamDDP) and not choice.shards_parameters
    with pytest.raises(ValueError, match="'team-ddp' is taken"):
        _registry.register_strategy("team-ddp", lambda package: TeamDDP)
    # Registered sharding comes from the registration; an instance's from its Lightning base.
    assert [choose_strategy(n, None).shards_parameters for n in ("ddp", "fsdp", "fsdp2")] == [
        False, True, True]
    assert choose_strategy(FSDPStrategy(), None).shards_parameters
    assert not choose_strategy(TeamDDP(), None).shards_parameters
