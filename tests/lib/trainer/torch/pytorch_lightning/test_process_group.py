"""The torch process-group settings Ray Train's controller reads (``_process_group``).

The end-to-end test runs a real 2-worker fit and looks inside the real controller process
through a Ray Train controller callback: the process group is made over ``init_method="tcp"``
(the path this module builds itself; the default ``"env"`` runs in every other trainer test),
and the controller never imported torch.
"""

from __future__ import annotations

import json
import sys

import pytest
from _models import create_probe_model, make_regression_datasets, read_records, ship_by_value
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchConfig
from ray.train.v2._internal.execution.callback import ControllerCallback

from michelangelo.lib.trainer.torch.pytorch_lightning import (
    LightningTrainer,
    LightningTrainerParam,
)
from michelangelo.lib.trainer.torch.pytorch_lightning._process_group import (
    ProcessGroupConfig,
    for_controller,
)

ship_by_value(__name__)


class ControllerModules(ControllerCallback):
    """Runs in Ray Train's controller: writes which of the heavy modules it has loaded."""

    def __init__(self, path: str) -> None:
        self.path = path

    def after_controller_start(self, train_run_context) -> None:
        loaded = sorted({name.split(".")[0] for name in sys.modules}
                        & {"torch", "pytorch_lightning", "lightning_fabric"})
        with open(self.path, "w") as handle:
            json.dump({"loaded": loaded,
                       "config": type(train_run_context.backend_config).__name__,
                       "init_method": train_run_context.backend_config.init_method}, handle)


def test_for_controller_keeps_every_setting_of_a_plain_torch_config():
    assert for_controller(None) == ProcessGroupConfig()
    config = for_controller(TorchConfig(backend="gloo", init_method="tcp", timeout_s=42))
    assert config == ProcessGroupConfig(backend="gloo", init_method="tcp", timeout_s=42)
    assert config.as_torch_config() == TorchConfig(backend="gloo", init_method="tcp",
                                                   timeout_s=42)
    assert config.to_dict() == TorchConfig(backend="gloo", init_method="tcp",
                                           timeout_s=42).to_dict()


def test_a_torch_config_subclass_is_handed_to_ray_as_it_is():
    class OwnConfig(TorchConfig):
        pass

    own = OwnConfig(backend="gloo")
    assert for_controller(own) is own


def test_an_unknown_init_method_fails_on_the_driver_naming_the_field(tmp_path):
    train, _ = make_regression_datasets(16)
    with pytest.raises(ValueError, match=r"torch_config.init_method='file'.*Fix: "
                                         r"TorchConfig\(init_method='env'\)"):
        LightningTrainer(
            LightningTrainerParam(create_model_fn=create_probe_model,
                                  create_model_fn_kwargs={"record_dir": str(tmp_path)},
                                  train_data=train, val_data=None),
            run_config=RunConfig(name="bad", storage_path=str(tmp_path / "ray")),
            scaling_config=ScalingConfig(num_workers=2),
            torch_config=TorchConfig(init_method="file"),
        )
    assert not (tmp_path / "ray").exists()


@pytest.mark.usefixtures("ray_cluster")
def test_a_tcp_process_group_trains_and_the_controller_never_imports_torch(tmp_path):
    records = tmp_path / "records"
    records.mkdir()
    probe = tmp_path / "controller.json"
    train, val = make_regression_datasets(64, 16)
    user_config = TorchConfig(init_method="tcp", timeout_s=120)
    trainer = LightningTrainer(
        LightningTrainerParam(
            create_model_fn=create_probe_model,
            create_model_fn_kwargs={"record_dir": str(records)},
            train_data=train, val_data=val, batch_size=8,
            lightning_trainer_kwargs={"max_epochs": 1},
        ),
        run_config=RunConfig(name="tcp", storage_path=str(tmp_path / "ray"),
                             callbacks=[ControllerModules(str(probe))]),
        scaling_config=ScalingConfig(num_workers=2),
        torch_config=user_config,
    )
    result = trainer.train()

    # 64 rows over 2 ranks at batch 8: 4 steps each; DDP could not have run without the group.
    assert result["metrics"]["step"] == 4
    assert [r["rank"] for r in read_records(str(records), "fit_start")] == [0, 1]
    seen = json.loads(probe.read_text())
    assert seen == {"loaded": [], "config": "ProcessGroupConfig", "init_method": "tcp"}
    # The user's object is not changed (Ray's TorchTrainer fills in its backend).
    assert user_config == TorchConfig(init_method="tcp", timeout_s=120)
