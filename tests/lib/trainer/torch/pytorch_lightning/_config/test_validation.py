"""Driver-side validation: every error names the field and the fix, before any worker starts."""

from __future__ import annotations

import logging
import os
import threading
import time
import warnings

import pytest
import ray
import torch
from _models import (
    create_probe_model,
    create_tiny_model,
    ship_by_value,
)
from pytorch_lightning.callbacks import EarlyStopping, ModelCheckpoint
from pytorch_lightning.strategies import FSDPStrategy
from ray.train import RunConfig, ScalingConfig

from michelangelo.lib.trainer.torch.pytorch_lightning import (
    LightningTrainer,
    LightningTrainerParam,
    TransferLearningSpec,
)
from michelangelo.lib.trainer.torch.pytorch_lightning._config import resolve_lightning_kwargs

ship_by_value(__name__)


RAY_NUM_CPUS = 2


class LockedObserver:
    def __init__(self):
        self.lock = threading.Lock()  # cannot be pickled

    def on_result(self, metrics, checkpoint_path):
        pass

    def on_checkpoint_saved(self, epoch, step, metrics, checkpoint_path):
        pass


class LockedStore:
    def __init__(self):
        self.lock = threading.Lock()

    def track(self, storage_path, run_name, experiment_dir):
        pass

    def locate_resumable(self, storage_path, run_name):
        return None


def _unpicklable_factory():
    lock = threading.Lock()

    def create():
        assert lock
        return create_tiny_model()

    return create


def _unpicklable_collate():
    lock = threading.Lock()
    return lambda batch: (lock, batch)[1]


def _even_width_model(hidden_dim=8):
    if hidden_dim % 2:
        raise ValueError(f"hidden_dim must be even, got {hidden_dim}")
    return create_tiny_model(hidden_dim=hidden_dim)


def _plain_torch_model():
    return torch.nn.Sequential(torch.nn.Linear(8, 1))


def _trainer_case(kwargs, fragments, case_id):
    return pytest.param({"lightning_trainer_kwargs": kwargs}, [*fragments, "Fix"], id=case_id)


# The four classes of issue 10: a factory argument, a Trainer key, a Trainer value Lightning
# refuses, and (in its own test below) val_data=None.
FACTORY_CASES = [
    pytest.param({"create_model_fn_kwargs": {"hiden_dim": 3}},
                 ["create_model_fn_kwargs['hiden_dim']", "did you mean 'hidden_dim'",
                  "Fix: rename 'hiden_dim' to 'hidden_dim'"], id="factory-kwarg-typo"),
    pytest.param({"create_model_fn_kwargs": {"hidden_dim": 3, "dropout": 0.1}},
                 ["create_model_fn_kwargs['dropout']", "It takes: hidden_dim, lr"],
                 id="factory-kwarg-unknown"),
    pytest.param({"create_model_fn": create_probe_model},
                 ["create_model_fn_kwargs lacks 'record_dir'", "Fix: add"],
                 id="factory-missing-arg"),
    pytest.param({"create_model_fn": _even_width_model, "create_model_fn_kwargs": {"hidden_dim": 3}},
                 ["raised ValueError: hidden_dim must be even, got 3", "Fix"],
                 id="factory-raises"),
    pytest.param({"create_model_fn": _plain_torch_model},
                 ["returned Sequential", "pytorch_lightning.LightningModule", "Fix"],
                 id="factory-not-lightning"),
]

TRAINER_CASES = [
    _trainer_case({"max_epoch": 3}, ["lightning_trainer_kwargs['max_epoch']",
                                     "did you mean 'max_epochs'"], "trainer-key-typo"),
    _trainer_case({"max_epochs": 2, "gradient_clip": 1.0, "acumulate_grad_batches": 2},
                  ["'gradient_clip' (did you mean 'gradient_clip_val'?)",
                   "'acumulate_grad_batches' (did you mean 'accumulate_grad_batches'?)"],
                  "trainer-key-typos"),
    _trainer_case({"max_epochs": -3}, ["lightning_trainer_kwargs['max_epochs']=-3",
                                       "non-negative integer or -1"], "max-epochs"),
    _trainer_case({"max_steps": -5}, ["['max_steps']=-5", "non-negative integer"], "max-steps"),
    _trainer_case({"check_val_every_n_epoch": 0}, ["['check_val_every_n_epoch']=0", ">= 1"],
                  "check-val-every-n-epoch"),
    _trainer_case({"accumulate_grad_batches": 0}, ["['accumulate_grad_batches']=0", ">= 1"],
                  "accumulate-grad-batches"),
    _trainer_case({"precision": "17"}, ["['precision']='17'", "'bf16-mixed'"], "precision-name"),
    _trainer_case({"log_every_n_steps": -1}, ["['log_every_n_steps']=-1", ">= 0"],
                  "log-every-n-steps"),
    _trainer_case({"max_epochs": "3"}, ["['max_epochs']='3'", "int or None"], "max-epochs-str"),
    _trainer_case({"gradient_clip_algorithm": "l2"}, ["['gradient_clip_algorithm']='l2'",
                                                      "['value', 'norm']"], "clip-algorithm"),
    _trainer_case({"max_epochs": 2, "log_every_n_steps": 5, "val_check_interval": -1},
                  ["['val_check_interval']=-1", "has to be in [0.0, 1.0] or an int"],
                  "val-check-interval-among-valid-keys"),
    _trainer_case({"limit_train_batches": 1.5}, ["['limit_train_batches']=1.5"],
                  "limit-train-batches"),
    _trainer_case({"fast_dev_run": -1}, ["['fast_dev_run']=-1", ">= 0"], "fast-dev-run"),
    _trainer_case({"max_time": "ten minutes"}, ["['max_time']='ten minutes'", "DD:HH:MM:SS"],
                  "max-time"),
    _trainer_case({"callbacks": [EarlyStopping("val_loss"), "checkpoint"]},
                  ["['callbacks']", "list[Callback]"], "callback-type"),
    _trainer_case({"plugins": ["amp"]}, ["['plugins']=['amp']"], "plugin-type"),
    _trainer_case({"barebones": True, "logger": "csv"}, ["['logger']='csv'", "barebones mode"],
                  "barebones-with-logger"),
    _trainer_case({"accelerator": "gpuu"}, ["['accelerator']='gpuu'", "did you mean 'gpu'"],
                  "accelerator-name"),
]

CASES = FACTORY_CASES + TRAINER_CASES + [
    pytest.param({"lightning_trainer_kwargs": {"precision": "16-mixed"}},
                 ["precision", "16-mixed", "bf16-mixed", "use_gpu=True"], id="fp16-on-cpu"),
    pytest.param({"lightning_trainer_kwargs": {"strategy": "fsdp", "gradient_clip_val": 1.0}},
                 ["gradient_clip_val", "fsdp", "gradient_clip_algorithm='value'"],
                 id="norm-clipping-under-fsdp"),
    pytest.param({"lightning_trainer_kwargs": {"strategy": FSDPStrategy(),
                                               "gradient_clip_val": 0.5}},
                 ["gradient_clip_val", "FSDPStrategy(...)", "clips each shard by its own norm",
                  "gradient_clip_algorithm='value'"],
                 id="norm-clipping-under-an-fsdp-strategy-object"),
    pytest.param({"lightning_trainer_kwargs": {"strategy": "horovod"}},
                 ["strategy", "horovod", "fsdp2"], id="unknown-strategy"),
    pytest.param({"lightning_trainer_kwargs": {"strategy": "fsdp2",
                                               "strategy_kwargs": {"tensor_parallel_size": 2}}},
                 ["tensor_parallel_size", "Fix"], id="fsdp2-kwargs"),
    pytest.param({"create_model_fn": _unpicklable_factory()},
                 ["LightningTrainerParam.create_model_fn", "cannot be pickled", "Fix"],
                 id="unpicklable-factory"),
    pytest.param({"training_observer": LockedObserver()},
                 ["LightningTrainerParam.training_observer", "cannot be pickled"],
                 id="unpicklable-observer"),
    pytest.param({"experiment_store": LockedStore()},
                 ["LightningTrainerParam.experiment_store", "cannot be pickled"],
                 id="unpicklable-store"),
    pytest.param({"data_collate_fn": _unpicklable_collate()},
                 ["LightningTrainerParam.data_collate_fn", "cannot be pickled"],
                 id="unpicklable-collate"),
    pytest.param({"initial_weights_path": "/nonexistent/model.pt"},
                 ["initial_weights_path='/nonexistent/model.pt'", "does not exist", "Fix"],
                 id="missing-weights"),
    pytest.param({"initial_weights_path": "file:///nonexistent/model.pt"},
                 ["file:///nonexistent/model.pt", "does not exist"], id="missing-file-url"),
    pytest.param({"transfer_learning_spec": TransferLearningSpec(
        layer_names_to_freeze=["encoder"], layer_names_to_freeze_regex=[r"^net\.0\."])},
        ["layer_names_to_freeze: 'encoder'", "net.0.weight", "Fix"], id="freeze-no-match"),
]


@pytest.mark.parametrize(("overrides", "fragments"), CASES)
def test_errors_raised_at_construction_before_any_worker(data, tmp_path, overrides, fragments):
    train, val = data
    actors_before = len(ray._private.state.actors())
    kwargs = {"create_model_fn": create_tiny_model, "create_model_fn_kwargs": {},
              "train_data": train, "val_data": val, **overrides}
    start = time.perf_counter()
    with pytest.raises(ValueError) as info:
        LightningTrainer(
            trainer_param=LightningTrainerParam(**kwargs),
            run_config=RunConfig(name="never", storage_path=str(tmp_path / "ray")),
            scaling_config=ScalingConfig(num_workers=2),
        )
    # Measured, not asserted (no wall-clock assertions): run with -s to read it.
    print(f"\n{time.perf_counter() - start:.3f}s to refuse: {str(info.value)[:90]}")
    for fragment in fragments:
        assert fragment in str(info.value)
    # Ray Train never started: no controller or worker actors, nothing written to storage.
    assert len(ray._private.state.actors()) == actors_before
    assert not (tmp_path / "ray").exists()


def test_bf16_on_cpu_and_fp16_on_gpu_are_accepted(data, tmp_path):
    train, val = data
    for precision, use_gpu in (("bf16-mixed", False), ("16-mixed", True), ("32", False)):
        LightningTrainer(
            trainer_param=LightningTrainerParam(
                create_model_fn=create_tiny_model, create_model_fn_kwargs={},
                train_data=train, val_data=val,
                lightning_trainer_kwargs={"precision": precision}),
            run_config=RunConfig(name="ok", storage_path=str(tmp_path)),
            scaling_config=ScalingConfig(num_workers=1, use_gpu=use_gpu),
        )


def test_value_clipping_under_fsdp_is_accepted(data):
    train, val = data
    LightningTrainer(
        trainer_param=LightningTrainerParam(
            create_model_fn=create_tiny_model, create_model_fn_kwargs={},
            train_data=train, val_data=val,
            lightning_trainer_kwargs={"strategy": "fsdp", "gradient_clip_val": 1.0,
                                      "gradient_clip_algorithm": "value"}),
        scaling_config=ScalingConfig(num_workers=1),
    )


def test_trainer_param_type_checked():
    with pytest.raises(ValueError, match="trainer_param must be a LightningTrainerParam"):
        LightningTrainer(trainer_param={"batch_size": 8})


def test_is_a_torch_trainer():
    from ray.train.torch import TorchTrainer

    assert issubclass(LightningTrainer, TorchTrainer)
    assert torch.__version__


def test_common_trainer_arguments_pass_the_probe(data, tmp_path):
    train, val = data
    kwargs = {
        "max_epochs": -1, "max_steps": 6, "min_epochs": 0, "check_val_every_n_epoch": None,
        "val_check_interval": 2, "limit_train_batches": 0.5, "limit_val_batches": 3,
        "precision": "bf16-mixed", "gradient_clip_val": 1.0, "gradient_clip_algorithm": "value",
        "accumulate_grad_batches": 2, "log_every_n_steps": 0, "num_sanity_val_steps": -1,
        "max_time": "00:00:10:00", "deterministic": "warn", "accelerator": "auto",
        "callbacks": [EarlyStopping("val_loss"), ModelCheckpoint(monitor="val_loss")],
        "strategy": "ddp", "strategy_kwargs": {"find_unused_parameters": False},
    }
    param = LightningTrainerParam(
        create_model_fn=create_tiny_model, create_model_fn_kwargs={"hidden_dim": 4},
        train_data=train, val_data=val, lightning_trainer_kwargs=kwargs)
    LightningTrainer(trainer_param=param, scaling_config=ScalingConfig(num_workers=1))
    assert resolve_lightning_kwargs(param).trainer_kwargs["max_steps"] == 6


def test_probe_writes_nothing_and_leaves_the_driver_as_it_was(data, tmp_path, capfd, caplog):
    train, val = data
    watched = tmp_path / "watched"
    watched.mkdir()
    checkpoint = ModelCheckpoint(dirpath=str(watched / "ckpt"), monitor="val_loss")
    callbacks = [checkpoint]
    flags = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.benchmark,
             os.environ.get("CUBLAS_WORKSPACE_CONFIG"))
    with caplog.at_level(logging.INFO):
        LightningTrainer(
            trainer_param=LightningTrainerParam(
                create_model_fn=create_tiny_model, create_model_fn_kwargs={},
                train_data=train, val_data=val,
                lightning_trainer_kwargs={
                    "callbacks": callbacks, "deterministic": True, "benchmark": True,
                    "logger": "csv", "logger_kwargs": {"save_dir": str(watched / "logs")},
                    "profiler": "simple", "default_root_dir": str(watched / "root"),
                }),
            run_config=RunConfig(name="quiet", storage_path=str(tmp_path / "ray")),
            scaling_config=ScalingConfig(num_workers=1),
        )
    # The probe Trainer ran no hook and opened no logger: nothing written.
    assert os.listdir(watched) == []
    # Torch flags Trainer.__init__ sets for deterministic/benchmark are put back.
    assert (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.benchmark,
            os.environ.get("CUBLAS_WORKSPACE_CONFIG")) == flags
    # Lightning appends its own callbacks to the list it gets; the user's list is untouched.
    assert callbacks == [checkpoint]
    # Lightning's device banner stays on the workers.
    assert "GPU available" not in capfd.readouterr().err + caplog.text


def test_strategy_instance_is_not_built_into_the_probe(data):
    from ray.train.lightning import RayDDPStrategy

    train, val = data
    LightningTrainer(
        trainer_param=LightningTrainerParam(
            create_model_fn=create_tiny_model, create_model_fn_kwargs={},
            train_data=train, val_data=val,
            lightning_trainer_kwargs={"strategy": RayDDPStrategy(), "max_epochs": 2}),
        scaling_config=ScalingConfig(num_workers=2),
    )
    assert not torch.distributed.is_initialized()


def test_val_data_none_trains_without_validation_and_warns_once(data, tmp_path):
    train, _ = data
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = LightningTrainer(
            trainer_param=LightningTrainerParam(
                create_model_fn=create_tiny_model, create_model_fn_kwargs={},
                train_data=train, val_data=None, lightning_trainer_kwargs={"max_epochs": 1}),
            run_config=RunConfig(name="noval", storage_path=str(tmp_path)),
            scaling_config=ScalingConfig(num_workers=1),
        )
    messages = [str(w.message) for w in caught if "val_data=None" in str(w.message)]
    assert len(messages) == 1 and "trains without validation" in messages[0]
    assert set(trainer.datasets) == {"train"}
    metrics = trainer.train()["metrics"]
    assert metrics["step"] == 2  # 16 rows in batches of 8, one epoch
    assert not [name for name in metrics if name.startswith("val")]


def test_val_data_none_names_monitored_metrics(data):
    train, _ = data
    with pytest.warns(UserWarning, match=r"monitor \['val_loss'\]"):
        LightningTrainer(
            trainer_param=LightningTrainerParam(
                create_model_fn=create_tiny_model, create_model_fn_kwargs={},
                train_data=train, val_data=None,
                lightning_trainer_kwargs={"callbacks": [ModelCheckpoint(monitor="val_loss")]}),
            scaling_config=ScalingConfig(num_workers=1),
        )


def test_val_data_given_does_not_warn(data):
    train, val = data
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        LightningTrainer(
            trainer_param=LightningTrainerParam(
                create_model_fn=create_tiny_model, create_model_fn_kwargs={},
                train_data=train, val_data=val),
            scaling_config=ScalingConfig(num_workers=1),
        )
    assert not [w for w in caught if "val_data" in str(w.message)]
