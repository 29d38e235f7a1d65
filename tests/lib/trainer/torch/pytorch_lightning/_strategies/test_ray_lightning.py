"""Ray's Lightning classes as a ``pytorch_lightning.Trainer`` accepts them.

``ray.train.lightning`` builds its classes on ``lightning.pytorch`` whenever the ``lightning``
package is importable. On a machine with both Lightning packages (the GPU check's CUDA image
has both) every LightningTrainer worker then failed in ``pl.Trainer(...)``. The end-to-end test
here gives this module's Ray workers the ``lightning`` package (``make test`` installs it
beside the venv, outside it) and trains a ``pytorch_lightning`` module as the guide writes it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import pytorch_lightning as pl
import ray.train.lightning
from _models import (
    ISOLATED_STATE_API,
    TinyRegressor,
    make_regression_datasets,
    ship_by_value,
)
from ray.train import RunConfig, ScalingConfig

from michelangelo.lib.trainer.torch.pytorch_lightning import (
    LightningTrainer,
    LightningTrainerParam,
)
from michelangelo.lib.trainer.torch.pytorch_lightning._strategies import (
    _ray_lightning as builds,
)
from michelangelo.lib.trainer.torch.pytorch_lightning._strategies import ray_lightning

ship_by_value(__name__)

# Where `make test` installs the `lightning` package (pip --target), for Ray's workers only.
LIGHTNING_SIDE = os.path.join(sys.prefix, "side-lightning")
RAY_NUM_CPUS = 3
RAY_ENV_VARS = {
    "PYTHONPATH": os.pathsep.join(p for p in (LIGHTNING_SIDE, os.environ.get("PYTHONPATH"))
                                  if p),
    **ISOLATED_STATE_API,
}


def test_ray_own_classes_where_ray_builds_on_pytorch_lightning():
    chosen = ray_lightning()
    ray_on_pl = issubclass(ray.train.lightning.RayDDPStrategy, pl.strategies.DDPStrategy)
    assert chosen.from_ray is ray_on_pl
    if ray_on_pl:
        assert chosen.ddp is ray.train.lightning.RayDDPStrategy
        assert chosen.environment is ray.train.lightning.RayLightningEnvironment
    for cls in chosen.strategies:
        assert issubclass(cls, pl.strategies.Strategy)


def test_builds_refuse_other_strategies():
    trainer = pl.Trainer(strategy=pl.strategies.DDPStrategy(), accelerator="cpu", devices=1,
                         logger=False, enable_checkpointing=False)
    with pytest.raises(RuntimeError, match="DDPStrategy.*RayDDPStrategy"):
        builds.prepare_trainer(trainer)


def _needs_side_package() -> None:
    if not os.path.isdir(os.path.join(LIGHTNING_SIDE, "lightning")):
        pytest.skip(f"no `lightning` package in {LIGHTNING_SIDE}: `make test` installs it")


def test_a_ray_strategy_built_on_lightning_is_refused_on_the_driver_with_the_fix():
    # As a user would pass it, on a machine with both packages: Ray's documented class.
    _needs_side_package()
    code = (
        "import ray.train.lightning as r\n"
        "from michelangelo.lib.trainer.torch.pytorch_lightning._strategies import choose_strategy\n"
        "print(choose_strategy('ddp', {'find_unused_parameters': True}).build())\n"
        "choose_strategy(r.RayDDPStrategy(), None)\n"
    )
    env = {**os.environ, "PYTHONPATH": RAY_ENV_VARS["PYTHONPATH"]}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 1, done.stderr
    assert "_ray_lightning.RayDDPStrategy" in done.stdout  # the name still resolves there
    error = done.stderr.strip().splitlines()[-1]
    assert error.startswith("ValueError: lightning_trainer_kwargs['strategy']=")
    assert "is a lightning.pytorch strategy" in error
    assert "Fix: give the strategy by name" in error


class RecordingRegressor(TinyRegressor):
    """:class:`TinyRegressor` that records the classes its worker's trainer was given."""

    def __init__(self, record_dir: str) -> None:
        super().__init__()
        self.record_dir = record_dir

    def on_fit_start(self) -> None:
        import ray.train.lightning

        def modules(cls: type) -> list[str]:
            return [f"{c.__module__}.{c.__qualname__}" for c in cls.__mro__]

        strategy = self.trainer.strategy
        record = {
            "lightning_importable": importlib.util.find_spec("lightning") is not None,
            "ray_ddp": modules(ray.train.lightning.RayDDPStrategy),
            "strategy": modules(type(strategy)),
            "environment": modules(type(strategy.cluster_environment)),
            "rank": strategy.global_rank,
            "world_size": strategy.world_size,
            "device": str(strategy.root_device),
        }
        path = os.path.join(self.record_dir, f"rank{self.global_rank}.json")
        with open(path, "w") as handle:
            json.dump(record, handle)


def test_trains_where_lightning_is_installed_too(ray_cluster, tmp_path):
    _needs_side_package()
    record_dir = tmp_path / "records"
    record_dir.mkdir()
    train, val = make_regression_datasets(32, 8)
    result = LightningTrainer(
        trainer_param=LightningTrainerParam(
            create_model_fn=RecordingRegressor,
            create_model_fn_kwargs={"record_dir": str(record_dir)},
            train_data=train, val_data=val),
        run_config=RunConfig(name="both-lightnings", storage_path=str(tmp_path / "ray")),
        scaling_config=ScalingConfig(num_workers=2),
    ).train()

    records = [json.loads((record_dir / f"rank{r}.json").read_text()) for r in (0, 1)]
    for rank, record in enumerate(records):
        # The situation of the GPU check: Ray built its classes on lightning.pytorch.
        assert record["lightning_importable"]
        assert any(m.startswith("lightning.pytorch.") for m in record["ray_ddp"])
        # The trainer got the pytorch_lightning builds, on Ray's ranks and device.
        assert record["strategy"][0].endswith("_ray_lightning.RayDDPStrategy")
        assert any(m.startswith("pytorch_lightning.strategies.ddp.") for m in record["strategy"])
        assert record["environment"][0].endswith("_ray_lightning.RayLightningEnvironment")
        assert (record["rank"], record["world_size"], record["device"]) == (rank, 2, "cpu")
    assert result["metrics"]["step"] == 2  # 16 rows per worker, batch size 8
    assert os.path.exists(os.path.join(result["checkpoint_path"], "checkpoint.ckpt"))
