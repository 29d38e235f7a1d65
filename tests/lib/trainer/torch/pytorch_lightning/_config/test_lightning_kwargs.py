"""Resolution of lightning_trainer_kwargs: changed defaults, checkpointing, siblings."""

from __future__ import annotations

import warnings

import pytest
from _models import create_tiny_model
from pytorch_lightning.callbacks import EarlyStopping, ModelCheckpoint
from pytorch_lightning.loggers import CSVLogger
from pytorch_lightning.profilers import SimpleProfiler

from michelangelo.lib.trainer.torch.pytorch_lightning import LightningTrainerParam
from michelangelo.lib.trainer.torch.pytorch_lightning._config._lightning_kwargs import (
    resolve_lightning_kwargs,
)

RAY_NUM_CPUS = 1


def resolve(data, lightning_trainer_kwargs=None, **kwargs):
    train, val = data
    param = LightningTrainerParam(create_model_fn=create_tiny_model, create_model_fn_kwargs={},
                                  train_data=train, val_data=val,
                                  lightning_trainer_kwargs=lightning_trainer_kwargs or {},
                                  **kwargs)
    return resolve_lightning_kwargs(param)


def test_three_changed_defaults(data):
    kwargs = resolve(data).trainer_kwargs
    assert kwargs["max_epochs"] == 1
    assert kwargs["num_sanity_val_steps"] == 0
    assert kwargs["enable_progress_bar"] is False


def test_defaults_are_overridable(data):
    kwargs = resolve(data, {"max_epochs": 5, "num_sanity_val_steps": 2,
                            "enable_progress_bar": True, "log_every_n_steps": 3}).trainer_kwargs
    assert (kwargs["max_epochs"], kwargs["num_sanity_val_steps"],
            kwargs["enable_progress_bar"], kwargs["log_every_n_steps"]) == (5, 2, True, 3)


@pytest.mark.parametrize("limit", [{"max_steps": 3000}, {"max_time": "00:12:00:00"},
                                   {"max_steps": 10, "max_time": {"hours": 2}}])
def test_a_step_or_time_limit_without_max_epochs_warns_of_the_epoch_default(data, limit):
    with pytest.warns(UserWarning) as caught:
        kwargs = resolve(data, limit).trainer_kwargs
    assert kwargs["max_epochs"] == 1  # the guide's default holds
    messages = [str(w.message) for w in caught if "without max_epochs" in str(w.message)]
    assert len(messages) == 1
    for key, value in limit.items():
        assert f"{key}={value!r}" in messages[0]
    assert "default max_epochs=1 still applies" in messages[0]
    assert "Fix: add lightning_trainer_kwargs['max_epochs']=-1" in messages[0]


@pytest.mark.parametrize("kwargs", [{"max_steps": 3000, "max_epochs": -1},
                                    {"max_steps": 3000, "max_epochs": 5}, {"max_steps": -1},
                                    {"max_time": None}])
def test_no_epoch_default_warning_when_max_epochs_is_given_or_no_limit_is(data, kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        resolve(data, kwargs)


def test_num_epochs_is_honoured_unless_max_epochs_given(data):
    with pytest.warns(FutureWarning):
        assert resolve(data, num_epochs=4).trainer_kwargs["max_epochs"] == 4
    with pytest.warns(FutureWarning), pytest.warns(UserWarning, match="max_epochs wins"):
        assert resolve(data, {"max_epochs": 2}, num_epochs=4).trainer_kwargs["max_epochs"] == 2


def test_enable_checkpointing_is_derived(data):
    assert resolve(data).trainer_kwargs["enable_checkpointing"] is False
    with_cb = resolve(data, {"callbacks": [EarlyStopping("val_loss"), ModelCheckpoint()]})
    assert with_cb.trainer_kwargs["enable_checkpointing"] is True
    single = resolve(data, {"callbacks": ModelCheckpoint()})
    assert single.trainer_kwargs["enable_checkpointing"] is True


def test_enable_checkpointing_given_is_ignored_with_warning(data):
    with pytest.warns(UserWarning, match=r"enable_checkpointing'\]=True is ignored"):
        resolved = resolve(data, {"enable_checkpointing": True})
    assert resolved.trainer_kwargs["enable_checkpointing"] is False


def test_siblings_are_split_off(data):
    resolved = resolve(data, {"strategy": "ddp", "strategy_kwargs": {"find_unused_parameters": True},
                              "logger": "csv", "logger_kwargs": {"save_dir": "/tmp/x"},
                              "profiler": "simple",
                              "profiler_kwargs": {"extended": False,
                                                  "upload_profiler_results": False}})
    for key in ("strategy", "strategy_kwargs", "logger", "logger_kwargs", "profiler",
                "profiler_kwargs"):
        assert key not in resolved.trainer_kwargs
    assert resolved.strategy.kwargs == {"find_unused_parameters": True}
    assert resolved.logger.name == "csv" and resolved.logger.kwargs == {"save_dir": "/tmp/x"}
    assert isinstance(resolved.logger.build(), CSVLogger)
    assert resolved.profiler.kwargs == {"extended": False}
    assert resolved.profiler.upload is False
    profiler = resolved.profiler.build("/tmp/profiles")
    assert isinstance(profiler, SimpleProfiler) and profiler.dirpath == "/tmp/profiles"


def test_profiler_object_gets_dirpath_only_when_unset():
    from michelangelo.lib.trainer.torch.pytorch_lightning._config._lightning_kwargs import (
        ProfilerChoice,
    )

    assert ProfilerChoice(instance=SimpleProfiler()).build("/p").dirpath == "/p"
    assert ProfilerChoice(instance=SimpleProfiler(dirpath="/mine")).build("/p").dirpath == "/mine"


def test_logger_instance_passes_through(data):
    logger = CSVLogger("/tmp/y")
    resolved = resolve(data, {"logger": logger})
    assert resolved.logger.build() is logger
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert resolve(data, {"logger": False}).logger.build() is False


@pytest.mark.parametrize(
    ("kwargs", "text"),
    [
        ({"devices": 2}, "ScalingConfig(num_workers=...)"),
        ({"num_nodes": 2}, "ScalingConfig(num_workers=...)"),
        ({"logger": "nope"}, "known logger name"),
        ({"logger_kwargs": {"a": 1}}, "only applies when 'logger' is a name"),
        ({"logger": "csv", "logger_kwargs": [1]}, "logger_kwargs'] must be a dict"),
        ({"profiler": "fast"}, "not a known profiler"),
        ({"profiler": 3}, "must be a name or a"),
        ({"profiler": SimpleProfiler(), "profiler_kwargs": {"extended": False}},
         "cannot configure a Profiler instance"),
        ({"profiler": "simple", "profiler_kwargs": {"upload_profiler_results": "no"}},
         "must be a bool"),
        ({"strategy_kwargs": 5}, "strategy_kwargs'] must be a dict"),
    ],
)
def test_errors_name_key_and_fix(data, kwargs, text):
    with pytest.raises(ValueError, match="Fix") as info:
        resolve(data, kwargs)
    assert text in str(info.value)


@pytest.mark.parametrize(
    ("kwargs", "fragments"),
    [
        ({"max_epoch": 3}, ["lightning_trainer_kwargs['max_epoch']", "did you mean 'max_epochs'",
                            "Fix: rename 'max_epoch' to 'max_epochs'"]),
        ({"strategy_kwarg": {"stage": 2}}, ["did you mean 'strategy_kwargs'"]),
        ({"precison": "bf16-mixed"}, ["did you mean 'precision'"]),
        ({"learning_rate": 0.1}, ["['learning_rate'] is not a parameter", "Fix: remove it"]),
        ({"max_epoch": 3, "gpus": 2}, ["'max_epoch' (did you mean 'max_epochs'?)", "'gpus'",
                                       "rename or remove them"]),
    ],
)
def test_every_key_is_checked_against_the_trainer_signature(data, kwargs, fragments):
    with pytest.raises(ValueError) as info:
        resolve(data, kwargs)
    for fragment in fragments:
        assert fragment in str(info.value)


def test_every_trainer_parameter_and_sibling_is_accepted_by_name():
    import inspect

    import pytorch_lightning as pl

    from michelangelo.lib.trainer.torch.pytorch_lightning._config._lightning_kwargs import (
        SIBLING_KEYS,
        trainer_parameters,
    )
    from michelangelo.lib.trainer.torch.pytorch_lightning._config._signature_check import (
        check_kwargs,
    )

    names = set(trainer_parameters())
    assert names == set(inspect.signature(pl.Trainer).parameters)
    check_kwargs(pl.Trainer, dict.fromkeys([*names, *SIBLING_KEYS]), label="k",
                 target="pytorch_lightning.Trainer", extra_names=SIBLING_KEYS)


def test_a_tuple_of_plugins_becomes_a_list(data):
    from lightning_fabric.plugins.environments import LightningEnvironment

    environment = LightningEnvironment()
    assert resolve(data, {"plugins": (environment,)}).trainer_kwargs["plugins"] == [environment]
