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
from pathlib import Path

import pytest
import pytorch_lightning as pl
import ray.train.lightning
from _models import (
    ISOLATED_STATE_API,
    TinyRegressor,
    create_tiny_fsdp2_model,
    make_regression_datasets,
    regression_loader,
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


def _classes(cls: type) -> list[str]:
    """``module.qualname`` of the class and each of its bases, nearest first."""
    return [f"{c.__module__}.{c.__qualname__}" for c in cls.__mro__]


def _write_record(record_dir: str, rank: int, record: dict) -> None:
    with open(os.path.join(record_dir, f"rank{rank}.json"), "w") as handle:
        json.dump(record, handle)


def _read_records(record_dir: Path) -> list[dict]:
    """What the two workers of a test wrote, by rank."""
    return [json.loads((record_dir / f"rank{rank}.json").read_text()) for rank in (0, 1)]


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
    assert error.startswith("michelangelo.errors.InputError: lightning_trainer_kwargs['strategy']=")
    assert "is a lightning.pytorch strategy" in error
    assert "Fix: give the strategy by name" in error


class RecordingRegressor(TinyRegressor):
    """:class:`TinyRegressor` that records the classes its worker's trainer was given."""

    def __init__(self, record_dir: str) -> None:
        super().__init__()
        self.record_dir = record_dir

    def on_fit_start(self) -> None:
        import ray.train.lightning

        strategy = self.trainer.strategy
        record = {
            "lightning_importable": importlib.util.find_spec("lightning") is not None,
            "ray_ddp": _classes(ray.train.lightning.RayDDPStrategy),
            "strategy": _classes(type(strategy)),
            "environment": _classes(type(strategy.cluster_environment)),
            "rank": strategy.global_rank,
            "world_size": strategy.world_size,
            "device": str(strategy.root_device),
        }
        _write_record(self.record_dir, self.global_rank, record)


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

    for rank, record in enumerate(_read_records(record_dir)):
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


def _fsdp2_loop_without_plugins(config: dict) -> None:
    """A hand-written Ray Train loop as Lightning's docs write one: no cluster environment given.

    Where both packages are installed, Ray's ``RayLightningEnvironment`` is a
    ``lightning.pytorch`` class that ``pytorch_lightning.Trainer`` refuses as a plugin, so this
    is how such a loop has to be written there.
    """
    import pytorch_lightning as pl

    from michelangelo.lib.trainer.torch.pytorch_lightning import RayModelParallelStrategy

    trainer = pl.Trainer(accelerator="cpu", devices="auto", strategy=RayModelParallelStrategy(),
                         max_epochs=1, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, logger=False)
    trainer.fit(create_tiny_fsdp2_model(hidden_dim=8), train_dataloaders=regression_loader(64))
    strategy = trainer.strategy
    _write_record(config["record_dir"], strategy.global_rank, {
        "lightning_importable": importlib.util.find_spec("lightning") is not None,
        "rank": strategy.global_rank,
        "world_size": strategy.world_size,
        "dp_size": strategy.device_mesh["data_parallel"].size(),
        "environment": _classes(type(strategy.cluster_environment)),
        "global_step": trainer.global_step,
    })


def test_fsdp2_in_a_hand_written_loop_takes_its_ranks_from_ray(ray_cluster, tmp_path):
    # Without a Ray environment Lightning picks its own from the process's variables, which
    # counts one process per node here: FSDP2 then built its mesh for a world of one and
    # rank 1 failed inside fully_shard with an IndexError.
    _needs_side_package()
    from ray.train.torch import TorchTrainer

    record_dir = tmp_path / "records"
    record_dir.mkdir()
    result = TorchTrainer(
        _fsdp2_loop_without_plugins,
        train_loop_config={"record_dir": str(record_dir)},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="fsdp2-both-lightnings", storage_path=str(tmp_path / "ray")),
    ).fit()
    assert result.error is None
    for rank, record in enumerate(_read_records(record_dir)):
        assert record["lightning_importable"]
        assert record["environment"][0].endswith(".RayLightningEnvironment")
        # The pytorch_lightning build (its bases are lightning_fabric's), not Ray's class,
        # which Ray built on the `lightning` package here.
        assert not any(m.startswith("lightning.") for m in record["environment"])
        assert (record["rank"], record["world_size"], record["dp_size"]) == (rank, 2, 2)
        assert record["global_step"] == 4  # 64 rows / 2 ranks / batch 8
