"""LightningTrainerParam: the guide's fields and defaults, deprecation and field errors."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
from _models import create_tiny_model

from michelangelo.lib.trainer.torch.pytorch_lightning import (
    IncrementalTrainingSpec,
    LightningTrainerParam,
    TransferLearningSpec,
)

RAY_NUM_CPUS = 1


def make(data, **kwargs):
    train, val = data
    base = {"create_model_fn": create_tiny_model, "create_model_fn_kwargs": {},
            "train_data": train, "val_data": val}
    return LightningTrainerParam(**{**base, **kwargs})


def test_guide_defaults(data):
    param = make(data)
    assert param.batch_size == 8
    assert param.num_shuffle_batches == 10
    assert param.num_epochs == 1
    assert param.data_collate_fn is None
    assert param.lightning_trainer_kwargs == {}
    for name in ("initial_weights_path", "transfer_learning_spec", "incremental_training_spec",
                 "training_observer", "experiment_store", "profiler_sink"):
        assert getattr(param, name) is None, name
    assert param.shuffle_buffer_rows == 80
    assert make(data, num_shuffle_batches=0).shuffle_buffer_rows is None


def test_required_fields_are_required():
    required = [f.name for f in dataclasses.fields(LightningTrainerParam)
                if f.init and f.default is dataclasses.MISSING
                and f.default_factory is dataclasses.MISSING]
    assert required == ["create_model_fn", "create_model_fn_kwargs", "train_data", "val_data"]


def test_num_epochs_is_deprecated_but_kept(data):
    with pytest.warns(FutureWarning, match=r"num_epochs=3 is deprecated.*max_epochs"):
        param = make(data, num_epochs=3)
    assert param.num_epochs == 3 and param.num_epochs_given
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not make(data).num_epochs_given


def test_param_is_frozen(data):
    with pytest.raises(dataclasses.FrozenInstanceError):
        make(data).batch_size = 4


@pytest.mark.parametrize(
    ("kwargs", "field", "fix"),
    [
        ({"create_model_fn": 3}, "create_model_fn", "function that returns"),
        ({"create_model_fn_kwargs": [1]}, "create_model_fn_kwargs", "pass a dict"),
        ({"train_data": [1, 2]}, "train_data", "ray.data.from_pandas"),
        ({"val_data": "x"}, "val_data", "or pass None"),
        ({"batch_size": 0}, "batch_size", "int >= 1"),
        ({"batch_size": True}, "batch_size", "int >= 1"),
        ({"num_shuffle_batches": -1}, "num_shuffle_batches", "0 turns shuffling off"),
        ({"data_collate_fn": "stack"}, "data_collate_fn", "pass a function"),
        ({"profiler_sink": 1}, "profiler_sink", "pass a function"),
        ({"lightning_trainer_kwargs": [("max_epochs", 1)]}, "lightning_trainer_kwargs",
         "pass a dict"),
        ({"initial_weights_path": ""}, "initial_weights_path", "local path or a URL"),
        ({"transfer_learning_spec": {"layer_names_to_freeze": ["a"]}},
         "transfer_learning_spec", "TransferLearningSpec("),
        ({"incremental_training_spec": 1}, "incremental_training_spec",
         "IncrementalTrainingSpec("),
        ({"training_observer": object()}, "training_observer", "on_checkpoint_saved"),
        ({"experiment_store": object()}, "experiment_store", "FsspecExperimentStore"),
    ],
)
def test_field_errors_name_field_value_and_fix(data, kwargs, field, fix):
    with pytest.raises(ValueError) as info:
        make(data, **kwargs)
    assert f"LightningTrainerParam.{field}" in str(info.value)
    assert fix in str(info.value)


def test_specs_accepted(data):
    param = make(data, transfer_learning_spec=TransferLearningSpec(layer_names_to_freeze=["net"]),
                 incremental_training_spec=IncrementalTrainingSpec(load_optimizer_weights=True))
    assert param.transfer_learning_spec.layer_names_to_freeze == ("net",)
