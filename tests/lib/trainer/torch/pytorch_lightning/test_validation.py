"""Driver-side validation: every error names the field and the fix, before any worker starts."""

from __future__ import annotations

import threading

import pytest
import ray
import torch
from _models import (
    create_tiny_model,
    make_regression_datasets,
    ship_by_value,
    start_test_ray,
)
from ray.train import RunConfig, ScalingConfig

from michelangelo.lib.trainer.torch.pytorch_lightning import (
    LightningTrainer,
    LightningTrainerParam,
    TransferLearningSpec,
)

ship_by_value(__name__)


@pytest.fixture(scope="module")
def data():
    start_test_ray(num_cpus=2)
    yield make_regression_datasets(16, 8)
    ray.shutdown()


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


CASES = [
    pytest.param({"lightning_trainer_kwargs": {"precision": "16-mixed"}},
                 ["precision", "16-mixed", "bf16-mixed", "use_gpu=True"], id="fp16-on-cpu"),
    pytest.param({"lightning_trainer_kwargs": {"strategy": "fsdp", "gradient_clip_val": 1.0}},
                 ["gradient_clip_val", "fsdp", "gradient_clip_algorithm='value'"],
                 id="norm-clipping-under-fsdp"),
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
    with pytest.raises(ValueError) as info:
        LightningTrainer(
            trainer_param=LightningTrainerParam(**kwargs),
            run_config=RunConfig(name="never", storage_path=str(tmp_path / "ray")),
            scaling_config=ScalingConfig(num_workers=2),
        )
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
