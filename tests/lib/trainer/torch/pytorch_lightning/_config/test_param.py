"""LightningTrainerParam: the guide's fields and defaults, deprecation and field errors."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import pytorch_lightning as pl
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
    assert param.stall_timeout_s == 300.0
    assert make(data, num_shuffle_batches=0).shuffle_buffer_rows is None


def test_required_fields_are_required(data):
    required = [f.name for f in dataclasses.fields(LightningTrainerParam)
                if f.init and f.default is dataclasses.MISSING
                and f.default_factory is dataclasses.MISSING]
    # train_data and val_data are required too, unless a DataModule gives the data; they have
    # a default only so that a DataModule run can leave them out.
    assert required == ["create_model_fn", "create_model_fn_kwargs"]
    fields = [f.name for f in dataclasses.fields(LightningTrainerParam)]
    assert fields[:4] == ["create_model_fn", "create_model_fn_kwargs", "train_data", "val_data"]
    train, _ = data
    with pytest.raises(ValueError, match=r"val_data is required with train_data.*val_data=None"):
        LightningTrainerParam(create_model_fn=create_tiny_model, create_model_fn_kwargs={},
                              train_data=train)
    with pytest.raises(ValueError, match=r"has no data.*train_data=.*create_datamodule_fn="):
        LightningTrainerParam(create_model_fn=create_tiny_model, create_model_fn_kwargs={})


class RegressionData(pl.LightningDataModule):
    def __init__(self, rows: int = 16, batch_size: int = 4):
        super().__init__()
        self.save_hyperparameters()


def test_a_datamodule_replaces_the_datasets():
    param = LightningTrainerParam(create_model_fn=create_tiny_model, create_model_fn_kwargs={},
                                  create_datamodule_fn=RegressionData,
                                  create_datamodule_fn_kwargs={"rows": 32})
    assert param.uses_datamodule
    assert param.create_datamodule_fn_kwargs == {"rows": 32}


@pytest.mark.parametrize("given", [("train_data",), ("val_data",), ("train_data", "val_data")])
def test_datasets_and_a_datamodule_together_are_refused(data, given):
    values = dict(zip(("train_data", "val_data"), data, strict=True))
    with pytest.raises(ValueError) as refused:
        LightningTrainerParam(create_model_fn=create_tiny_model, create_model_fn_kwargs={},
                              create_datamodule_fn=RegressionData,
                              **{name: values[name] for name in given})
    message = str(refused.value)
    assert "both create_datamodule_fn=RegressionData(rows=16, batch_size=4)" in message
    for name in given:
        assert f"{name}=" in message
    assert "Fix: drop train_data/val_data" in message


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"create_datamodule_fn": 3}, r"create_datamodule_fn must be callable, got 3"),
        ({"create_datamodule_fn_kwargs": {"rows": 4}},
         r"create_datamodule_fn_kwargs=\{'rows': 4\} is set without create_datamodule_fn"),
        ({"create_datamodule_fn": RegressionData, "create_datamodule_fn_kwargs": {"row": 4}},
         r"create_datamodule_fn_kwargs.*'row'"),
        ({"create_datamodule_fn": RegressionData, "data_collate_fn": lambda b: b},
         r"data_collate_fn=.*applies to Ray datasets only.*DataLoader a collate_fn"),
    ],
)
def test_datamodule_fields_are_checked(kwargs, expected):
    with pytest.raises(ValueError, match=expected):
        LightningTrainerParam(create_model_fn=create_tiny_model, create_model_fn_kwargs={},
                              **kwargs)


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
        ({"stall_timeout_s": 0}, "stall_timeout_s", "or None to turn the stall watchdog off"),
        ({"stall_timeout_s": "5m"}, "stall_timeout_s", "e.g. stall_timeout_s=600"),
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
