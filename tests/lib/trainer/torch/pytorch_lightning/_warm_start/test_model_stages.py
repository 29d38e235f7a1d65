"""Warm starts and freezing for models that build or rename layers in ``configure_model()``.

The driver decides from two meta-device builds whether each step applies as the factory
returns the model or after ``configure_model()``; here the worker side is run in-process
(no Ray) the way ``_loop`` runs it, and the FSDP2 shard copy on two real gloo processes.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest
import torch
from _models import TinyRegressor, TinyRegressorLazy, create_tiny_model
from torch import nn

from michelangelo.lib.model_registry import ModelRegistry
from michelangelo.lib.trainer.torch.pytorch_lightning import (
    IncrementalTrainingSpec,
    LearningMode,
    ModelSpec,
    TransferLearningMetadata,
    TransferLearningSpec,
)
from michelangelo.lib.trainer.torch.pytorch_lightning._strategies._registry import StrategyChoice
from michelangelo.lib.trainer.torch.pytorch_lightning._warm_start._freeze import frozen_names
from michelangelo.lib.trainer.torch.pytorch_lightning._warm_start._model_stages import (
    AFTER,
    BEFORE,
    MetaModels,
    first_stage_that_fits,
    run_after_configure,
)
from michelangelo.lib.trainer.torch.pytorch_lightning._warm_start._plan import (
    apply_warm_start,
    plan_warm_start,
)


class _Adapter(nn.Module):
    """Wraps a layer stack the way LoRA does: every name gains ``base.``."""

    def __init__(self, base: nn.Module) -> None:
        super().__init__()
        self.base = base
        self.scale = nn.Parameter(torch.ones(1))

    def forward(self, x):
        return self.base(x) * self.scale


class RenamingRegressor(TinyRegressor):
    def configure_model(self) -> None:
        if not isinstance(self.net, _Adapter):
            self.net = _Adapter(self.net)


def create_renaming(hidden_dim: int = 8) -> RenamingRegressor:
    return RenamingRegressor(hidden_dim=hidden_dim)


def create_lazy(hidden_dim: int = 8) -> TinyRegressorLazy:
    return TinyRegressorLazy(hidden_dim=hidden_dim)


class _Param:
    """The fields ``plan_warm_start`` reads from a ``LightningTrainerParam``."""

    def __init__(self, factory, transfer=None, incremental=None):
        self.create_model_fn, self.create_model_fn_kwargs = factory, {}
        self.transfer_learning_spec, self.incremental_training_spec = transfer, incremental
        self.initial_weights_path = None


def _resolved(strategy: StrategyChoice | None = None) -> SimpleNamespace:
    """The two fields of ``ResolvedKwargs`` that warm-start planning reads."""
    return SimpleNamespace(trainer_kwargs={"max_epochs": 5},
                           strategy=strategy or StrategyChoice("ddp"))


def _metadata(model: str) -> TransferLearningMetadata:
    return TransferLearningMetadata(baseline_model=ModelSpec("p", model, None))


def _on_worker(factory, warm):
    """``_loop``'s order: build, warm-start now or later, then Lightning's configure_model."""
    model, later = factory(), []
    apply_warm_start(model, warm, rank=0, world_size=1, later=later)
    if later:
        run_after_configure(model, lambda: [step() for step in later])
    model.configure_model()
    return model, len(later)


@pytest.fixture
def registry(tmp_path, monkeypatch):
    monkeypatch.setenv("MA_MODEL_REGISTRY_URL", str(tmp_path / "registry"))
    return ModelRegistry()


def _plan_inherit(registry, factory, layer: str, seed: int):
    """Register a seeded baseline, plan inheriting ``layer`` from it; ``(baseline, plan)``."""
    torch.manual_seed(seed)
    baseline = create_tiny_model().state_dict()
    registry.register("p", "base", state_dict=baseline)
    spec = TransferLearningSpec(metadata=_metadata("base"), layer_names_to_inherit=[layer])
    return baseline, plan_warm_start(_Param(factory, spec), _resolved())


def test_renamed_layers_inherit_by_the_names_the_factory_gives(registry):
    baseline, warm = _plan_inherit(registry, create_renaming, "net.0", seed=3)
    assert warm.inherit.stage == BEFORE
    assert [m for m, _ in warm.inherit.mapping] == ["net.0.weight", "net.0.bias"]
    model, queued = _on_worker(create_renaming, warm)
    assert queued == 0 and isinstance(model.net, _Adapter)
    assert torch.equal(model.net.base[0].weight, baseline["net.0.weight"])
    assert not torch.equal(model.net.base[2].weight, baseline["net.2.weight"])


def test_layers_built_in_configure_model_are_inherited_after_it(registry):
    baseline, warm = _plan_inherit(registry, create_lazy, "net.2", seed=4)
    assert warm.inherit.stage == AFTER
    model, queued = _on_worker(create_lazy, warm)
    assert queued == 1
    assert torch.equal(model.net[2].weight, baseline["net.2.weight"])
    assert not torch.equal(model.net[0].weight, baseline["net.0.weight"])
    # Lightning may call configure_model() again: nothing is copied twice.
    model.net[2].weight.data.zero_()
    model.configure_model()
    assert float(model.net[2].weight.detach().abs().sum()) == 0.0


def test_incremental_revision_of_a_renamed_model_loads_after_configure_model(registry):
    trained = create_renaming()
    trained.configure_model()
    registry.register("p", "m", state_dict=trained.state_dict())
    spec = IncrementalTrainingSpec(metadata=TransferLearningMetadata(
        learning_mode=LearningMode.INCREMENTAL_TRAINING, baseline_model=ModelSpec("p", "m", 1)))
    warm = plan_warm_start(_Param(create_renaming, incremental=spec), _resolved())
    assert warm.incremental.stage == AFTER
    model, _ = _on_worker(create_renaming, warm)
    for key, value in trained.state_dict().items():
        assert torch.equal(model.state_dict()[key], value), key


def test_a_revision_that_fits_neither_shape_names_the_model_tensors(registry):
    registry.register("p", "m", state_dict={"other.weight": torch.zeros(2, 2)})
    spec = IncrementalTrainingSpec(metadata=TransferLearningMetadata(
        learning_mode=LearningMode.INCREMENTAL_TRAINING, baseline_model=ModelSpec("p", "m", 1)))
    # The lazy model has no tensors before configure_model(): the error is about the built one.
    with pytest.raises(ValueError, match=r"does not fit the model \(missing tensors \['net\.0"):
        plan_warm_start(_Param(create_lazy, incremental=spec), _resolved())


def test_freezing_chooses_its_stage_the_same_way():
    models = MetaModels(create_lazy, {})
    spec = TransferLearningSpec(layer_names_to_freeze=["net.0"])
    stage, names = first_stage_that_fits(
        models, lambda m: frozen_names([n for n, _ in m.named_parameters()], spec))
    assert (stage, names) == (AFTER, ["net.0.weight", "net.0.bias"])
    stage, _ = first_stage_that_fits(
        MetaModels(create_renaming, {}),
        lambda m: frozen_names([n for n, _ in m.named_parameters()], spec))
    assert stage == BEFORE


def test_zero3_cannot_take_copies_into_layers_configure_model_creates(registry):
    registry.register("p", "base", state_dict=create_tiny_model().state_dict())
    spec = TransferLearningSpec(metadata=_metadata("base"), layer_names_to_inherit=["net.0"])
    zero3 = StrategyChoice("deepspeed", {"stage": 3})
    with pytest.raises(ValueError, match=r"ZeRO-3 partitions.*Fix: create the layers in "
                                         r"__init__"):
        plan_warm_start(_Param(create_lazy, spec), _resolved(zero3))
    # Layers that exist before configure_model() are copied before ZeRO-3 sees them.
    assert plan_warm_start(_Param(create_renaming, spec), _resolved(zero3)).inherit.stage == BEFORE


_SHARD_COPY = textwrap.dedent("""
    import os, sys
    import torch, torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from michelangelo.lib.trainer.torch.pytorch_lightning._warm_start._weights import copy_into

    rank = int(sys.argv[1])
    dist.init_process_group("gloo", init_method="file://" + sys.argv[2], rank=rank,
                            world_size=2)
    layer = torch.nn.Linear(4, 6)
    fully_shard(layer, mesh=init_device_mesh("cpu", (2,)))
    full = torch.arange(24, dtype=torch.float32).reshape(6, 4)
    with torch.no_grad():
        copy_into(layer.state_dict()["weight"], full)
    local = layer.weight.to_local()
    assert torch.equal(local, full[3 * rank:3 * rank + 3]), (rank, local)
    assert torch.equal(layer.weight.full_tensor(), full)
    dist.barrier()
    dist.destroy_process_group()
    print("ok", rank, flush=True)
    # What is checked is done. Skip the interpreter's teardown: with gloo over a FileStore,
    # a background thread can still be joinable there, and C++ then aborts the process
    # ("terminate called without an active exception", exit -6) after "ok" was printed.
    os._exit(0)
""")


def test_copy_into_cuts_each_rank_its_own_fsdp2_shard(tmp_path):
    script = tmp_path / "shard_copy.py"
    script.write_text(_SHARD_COPY)
    store = str(tmp_path / "store")
    procs = [subprocess.Popen([sys.executable, str(script), str(rank), store],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for rank in (0, 1)]
    # Two cold torch imports and a gloo rendezvous take about 10 s on a quiet machine; the
    # limit is for a hung rendezvous only, far above what a loaded CI machine needs.
    outputs = [proc.communicate(timeout=900)[0] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], outputs
    assert [out.strip().splitlines()[-1] for out in outputs] == ["ok 0", "ok 1"]
