"""Schema dataclasses: the guide's fields, defaults and errors."""

from __future__ import annotations

import dataclasses

import pytest

from michelangelo.lib.trainer.torch.pytorch_lightning import (
    IncrementalTrainingSpec,
    LearningMode,
    ModelSpec,
    TransferLearningSpec,
)
from michelangelo.lib.trainer.torch.pytorch_lightning.schema import TransferLearningMetadata


def test_guide_example_builds():
    spec = TransferLearningSpec(
        metadata=TransferLearningMetadata(
            learning_mode=LearningMode.TRANSFER_LEARNING,
            baseline_model=ModelSpec(project_name="my-project", model_name="base-encoder"),
        ),
        layer_names_to_freeze_regex=[r"^encoder\.embeddings\..*"],
    )
    assert spec.metadata.baseline_model.revision_id is None
    assert spec.layer_names_to_freeze_regex == (r"^encoder\.embeddings\..*",)
    assert spec.freezes


def test_fields_follow_the_guide():
    names = {f.name for f in dataclasses.fields(TransferLearningSpec)}
    assert names == {"metadata", "layer_names_to_freeze", "layer_names_to_freeze_regex",
                     "layer_names_to_inherit", "layer_names_to_inherit_regex",
                     "model_loader_function", "fused_model_submodule"}
    names = {f.name for f in dataclasses.fields(IncrementalTrainingSpec)}
    assert names == {"metadata", "load_optimizer_weights", "override_incremental_training_epoch",
                     "fused_model_submodule"}
    assert [f.name for f in dataclasses.fields(ModelSpec)] == [
        "project_name", "model_name", "revision_id"]
    assert {m.value for m in LearningMode} == {"TRANSFER_LEARNING", "INCREMENTAL_TRAINING"}


def test_everything_optional_except_model_identity():
    TransferLearningSpec()
    IncrementalTrainingSpec()
    TransferLearningMetadata()
    assert not TransferLearningSpec().freezes
    with pytest.raises(TypeError):
        ModelSpec()  # the identity is the point of a ModelSpec


def test_learning_mode_accepts_its_string_value():
    assert TransferLearningMetadata(learning_mode="INCREMENTAL_TRAINING").learning_mode is (
        LearningMode.INCREMENTAL_TRAINING)


@pytest.mark.parametrize(
    ("build", "text"),
    [
        (lambda: ModelSpec(project_name="", model_name="m"), "ModelSpec.project_name"),
        (lambda: ModelSpec(project_name="p", model_name="m", revision_id=1.5),
         "ModelSpec.revision_id"),
        (lambda: TransferLearningMetadata(learning_mode="nope"), "learning_mode='nope'"),
        (lambda: TransferLearningMetadata(baseline_model="m"), "baseline_model"),
        (lambda: TransferLearningSpec(layer_names_to_freeze="encoder"), "wrap it in a list"),
        (lambda: TransferLearningSpec(layer_names_to_freeze_regex=["("]),
         "not a valid regular expression"),
        (lambda: TransferLearningSpec(model_loader_function=3), "model_loader_function"),
        (lambda: TransferLearningSpec(metadata=1), "TransferLearningSpec.metadata"),
        (lambda: IncrementalTrainingSpec(override_incremental_training_epoch=-1),
         "override_incremental_training_epoch"),
        (lambda: IncrementalTrainingSpec(load_optimizer_weights="yes"), "load_optimizer_weights"),
        (lambda: IncrementalTrainingSpec(fused_model_submodule=1), "fused_model_submodule"),
    ],
)
def test_errors_name_the_field(build, text):
    with pytest.raises(ValueError, match="Fix") as info:
        build()
    assert text in str(info.value)
