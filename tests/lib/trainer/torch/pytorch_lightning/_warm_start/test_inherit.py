"""``TransferLearningSpec`` inherit through the model registry.

Name matching and the worker-side copy are checked in-process; one real LightningTrainer
run (2 CPU workers on a local Ray) checks that inherited, frozen layers still equal the
baseline's after training while the other layers moved. Every misconfiguration fails in the
LightningTrainer constructor, on the driver, before any worker exists.
"""

from __future__ import annotations

import pytest
import torch
from _models import create_tiny_model, ship_by_value
from ray.train import RunConfig, ScalingConfig

from michelangelo.lib.model_registry import ModelRegistry, RevisionNotFoundError
from michelangelo.lib.trainer.torch.pytorch_lightning import (
    LightningTrainer,
    LightningTrainerParam,
    ModelSpec,
    TransferLearningMetadata,
    TransferLearningSpec,
)
from michelangelo.lib.trainer.torch.pytorch_lightning._warm_start._inherit import (
    InheritPlan,
    apply_inherit,
    inherit_mapping,
)

ship_by_value(__name__)


RAY_NUM_CPUS = 3


def _spec(baseline: str | None = "p/base", **kwargs) -> TransferLearningSpec:
    metadata = None
    if baseline is not None:
        project, rest = baseline.split("/")
        model, _, alias = rest.partition("@")
        metadata = TransferLearningMetadata(
            baseline_model=ModelSpec(project, model, f"@{alias}" if alias else None))
    return TransferLearningSpec(metadata=metadata, **kwargs)


def _trainer(data, spec, tmp_path, name="inherit") -> LightningTrainer:
    train, val = data
    return LightningTrainer(
        trainer_param=LightningTrainerParam(
            create_model_fn=create_tiny_model, create_model_fn_kwargs={}, train_data=train,
            val_data=val, batch_size=8,
            transfer_learning_spec=spec, lightning_trainer_kwargs={"max_epochs": 1}),
        run_config=RunConfig(name=name, storage_path=str(tmp_path / "ray")),
        scaling_config=ScalingConfig(num_workers=2),
    )


def _baseline(hidden_dim: int = 8, seed: int = 7) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    return {k: v.clone() for k, v in create_tiny_model(hidden_dim=hidden_dim).state_dict().items()}


def test_mapping_names_modules_regexes_and_prefixes():
    model = {"net.0.weight": (4, 8), "net.0.bias": (4,), "net.2.weight": (1, 4)}
    spec = TransferLearningSpec(layer_names_to_inherit=["net.0"])
    assert inherit_mapping(model, model, spec) == [("net.0.weight", "net.0.weight"),
                                                   ("net.0.bias", "net.0.bias")]
    spec = TransferLearningSpec(layer_names_to_inherit_regex=[r"weight$"])
    assert [m for m, _ in inherit_mapping(model, model, spec)] == ["net.0.weight",
                                                                   "net.2.weight"]
    # A baseline registered from the inner module (no "net." prefix) lines up too.
    inner = {"0.weight": (4, 8), "0.bias": (4,), "2.weight": (1, 4)}
    assert inherit_mapping(model, inner, TransferLearningSpec()) == [
        ("net.0.weight", "0.weight"), ("net.0.bias", "0.bias"), ("net.2.weight", "2.weight")]
    with pytest.raises(ValueError, match=r"match no layer.*'net\.9'.*Layers in both"):
        inherit_mapping(model, model, TransferLearningSpec(layer_names_to_inherit=["net.9"]))
    with pytest.raises(ValueError, match=r"different shapes.*net\.0\.weight: model \[4, 8\] "
                                         r"vs baseline \[2, 8\]"):
        inherit_mapping(model, {**model, "net.0.weight": (2, 8)},
                        TransferLearningSpec(layer_names_to_inherit=["net.0"]))


def test_apply_copies_on_one_rank_and_model_loader_function_overrides(tmp_path):
    registry = ModelRegistry(str(tmp_path / "r"))
    baseline = _baseline()
    spec = registry.register("p", "base", state_dict=baseline)
    model = create_tiny_model()
    plan = InheritPlan(registry.url, spec, (("net.0.weight", "net.0.weight"),), None,
                       TransferLearningSpec())
    apply_inherit(model, plan, rank=0, world_size=1)
    assert torch.equal(model.net[0].weight, baseline["net.0.weight"])
    assert not torch.equal(model.net[0].bias, baseline["net.0.bias"])

    seen = {}

    def loader(target, weights):
        seen["keys"] = sorted(weights)
        target.net[2].weight.data.copy_(weights["net.2.weight"] * 2)

    plan = InheritPlan(registry.url, spec, None, loader, TransferLearningSpec())
    apply_inherit(model, plan, rank=0, world_size=1)
    assert seen["keys"] == sorted(baseline)
    assert torch.equal(model.net[2].weight, baseline["net.2.weight"] * 2)


def test_driver_side_failures_before_any_worker(data, tmp_path):
    registry = ModelRegistry()
    registry.register("p", "base", state_dict=_baseline())
    registry.register("p", "small", state_dict=_baseline(hidden_dim=4))
    cases = [
        (_spec(layer_names_to_inherit=["encoder"]), ValueError, "'encoder'"),
        (_spec(layer_names_to_inherit_regex=[r"^head\."]), ValueError, r"\^head"),
        (_spec("p/small", layer_names_to_inherit=["net.0"]), ValueError, "different shapes"),
        (_spec("p/base@champion", layer_names_to_inherit=["net.0"]), RevisionNotFoundError,
         "no alias 'champion'"),
        (_spec("p/nothing", layer_names_to_inherit=["net.0"]), RevisionNotFoundError,
         "has no revisions"),
        (_spec(None, layer_names_to_inherit=["net.0"]), ValueError, "no metadata.baseline_model"),
    ]
    for spec, error, message in cases:
        with pytest.raises(error, match=message):
            _trainer(data, spec, tmp_path)
    assert not (tmp_path / "ray").exists()  # no run started


def test_fused_model_submodule_warns():
    with pytest.warns(UserWarning, match="fused_model_submodule='encoder' has no effect"):
        TransferLearningSpec(fused_model_submodule="encoder")


def test_inherited_frozen_layers_equal_the_baseline_after_training(data, tmp_path):
    registry = ModelRegistry()
    baseline = _baseline()
    registry.register("p", "base", state_dict=baseline)
    registry.set_alias("p", "base", "champion", 1)
    spec = _spec("p/base@champion", layer_names_to_inherit=["net.0"],
                 layer_names_to_freeze=["net.0"])
    result = _trainer(data, spec, tmp_path).train()
    tuned = registry.load_state_dict(registry.register("p", "tuned", train_result=result))
    for name in ("net.0.weight", "net.0.bias"):
        assert torch.equal(tuned[name], baseline[name]), name
    for name in ("net.2.weight", "net.2.bias"):
        assert not torch.equal(tuned[name], baseline[name]), name
