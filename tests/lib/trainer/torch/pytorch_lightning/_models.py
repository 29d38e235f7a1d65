"""Tiny shared fixtures for the trainer tests: LightningModules and Ray datasets.

Everything here is small enough for a 2-core machine shared with other test runs.
Test modules whose functions or classes travel to Ray workers call
:func:`ship_by_value` on themselves, because pytest imports them under names a Ray
worker cannot import.
"""

from __future__ import annotations

import os
import sys
from types import ModuleType
from typing import Any

import numpy as np
import pytorch_lightning as pl
import torch
from torch import nn

FEATURES = 8


def ship_by_value(module: ModuleType | str) -> None:
    """Pickle ``module``'s functions and classes by value when they go to Ray workers."""
    import cloudpickle
    import ray.cloudpickle

    if isinstance(module, str):
        module = sys.modules[module]
    for pickler in (ray.cloudpickle, cloudpickle):
        pickler.register_pickle_by_value(module)


ship_by_value(__name__)


def regression_rows(n_rows: int, seed: int = 0) -> list[dict[str, Any]]:
    """Rows ``{"x": float32[8], "y": float32}`` of a noisy linear target."""
    rng = np.random.default_rng(seed)
    weights = np.linspace(-1.0, 1.0, FEATURES, dtype=np.float32)
    rows = []
    for _ in range(n_rows):
        x = rng.normal(size=FEATURES).astype(np.float32)
        y = np.float32(x @ weights + 0.01 * rng.normal())
        rows.append({"x": x, "y": y})
    return rows


def regression_loader(n_rows: int = 64, batch_size: int = 8) -> torch.utils.data.DataLoader:
    """A plain ``DataLoader`` of :func:`regression_rows` (seed 0) as tensor dicts, unshuffled."""
    from torch.utils.data import DataLoader

    items = [{"x": torch.from_numpy(r["x"]), "y": torch.tensor(r["y"])}
             for r in regression_rows(n_rows, seed=0)]
    return DataLoader(items, batch_size=batch_size)


def make_regression_datasets(n_rows: int = 128, val_rows: int | None = None, seed: int = 0):
    """``(train_ds, val_ds)`` Ray datasets with numpy float32 columns ``x`` (8,) and ``y``."""
    import ray.data

    val_rows = max(n_rows // 4, 8) if val_rows is None else val_rows
    train = ray.data.from_items(regression_rows(n_rows, seed))
    val = ray.data.from_items(regression_rows(val_rows, seed + 1))
    return train, val


class TinyRegressor(pl.LightningModule):
    """Two-layer MLP regressor logging ``train_loss`` and ``val_loss`` (synced)."""

    def __init__(self, hidden_dim: int = 8, lr: float = 1e-2) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = self.build_net(hidden_dim)
        self.lr = lr

    @staticmethod
    def build_net(hidden_dim: int) -> nn.Module:
        return nn.Sequential(nn.Linear(FEATURES, hidden_dim), nn.ReLU(), nn.Linear(hidden_dim, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).squeeze(-1)

    def _loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return nn.functional.mse_loss(self(batch["x"].float()), batch["y"].float())

    def training_step(self, batch, batch_idx):
        loss = self._loss(batch)
        self.log("train_loss", loss, sync_dist=True)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", self._loss(batch), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.lr)


class TinyRegressorLazy(TinyRegressor):
    """Same model, built in ``configure_model()`` (Lightning's delayed-initialisation hook)."""

    def __init__(self, hidden_dim: int = 8, lr: float = 1e-2) -> None:
        pl.LightningModule.__init__(self)
        self.save_hyperparameters()
        self.hidden_dim = hidden_dim
        self.lr = lr
        self.net: nn.Module | None = None

    def configure_model(self) -> None:
        if self.net is not None:
            return
        self.net = self.build_net(self.hidden_dim)


class TinyRegressorFSDP2(TinyRegressor):
    """Same model, sharded with FSDP2 as Lightning's ``ModelParallelStrategy`` docs show.

    The layers are built in ``__init__``; ``configure_model()`` shards each ``Linear`` and then
    the whole stack over the data-parallel mesh that Lightning hands the module.
    """

    def configure_model(self) -> None:
        from torch.distributed.fsdp import fully_shard

        mesh = self.device_mesh["data_parallel"]
        for layer in self.net.modules():
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(self.net, mesh=mesh)


def create_tiny_model(hidden_dim: int = 8, lr: float = 1e-2) -> TinyRegressor:
    """Factory for :class:`TinyRegressor` (runs on each Ray worker)."""
    return TinyRegressor(hidden_dim=hidden_dim, lr=lr)


def create_seeded_model(seed: int, hidden_dim: int = 8, lr: float = 1e-2) -> TinyRegressor:
    """:class:`TinyRegressor` whose initial weights depend only on ``seed``."""
    torch.manual_seed(seed)
    return TinyRegressor(hidden_dim=hidden_dim, lr=lr)


def create_tiny_fsdp2_model(hidden_dim: int = 8, lr: float = 1e-2) -> TinyRegressorFSDP2:
    """Factory for :class:`TinyRegressorFSDP2`, the documented FSDP2 pattern."""
    return TinyRegressorFSDP2(hidden_dim=hidden_dim, lr=lr)


def tiny_state_dict(hidden_dim: int = 8, fill: float = 0.5) -> dict[str, torch.Tensor]:
    """A state dict for :class:`TinyRegressor` with every value equal to ``fill``."""
    model = TinyRegressor(hidden_dim=hidden_dim)
    return {k: torch.full_like(v, fill) for k, v in model.state_dict().items()}


# Ray Train V2's PlacementGroupCleaner asks the state API whether the controller is alive. Without
# an address it follows /tmp/ray/ray_current_cluster, which may name ANOTHER Ray instance on this
# shared host; that instance does not know our controller, so the cleaner removes our placement
# group mid-run. Pointing the state API at a closed port makes the query fail, which the cleaner
# treats as "unknown, keep monitoring". (Worker environment variables, see ``start_test_ray``.)
ISOLATED_STATE_API = {"RAY_API_SERVER_ADDRESS": "http://127.0.0.1:9"}

# Worker environment variables for the modules that run in both Lightning installs: the
# workers import what this process imports (its PYTHONPATH, made absolute, which in the
# lightning_packages run holds the `lightning` package beside the venv), on the isolated state API.
SAME_IMPORTS_ENV = {
    "PYTHONPATH": os.pathsep.join(
        os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p),
    **ISOLATED_STATE_API,
}


def start_test_ray(num_cpus: int = 4, env_vars: dict[str, str] | None = None) -> None:
    """Start a local Ray for the trainer's tests, stopping any that runs in this process.

    Test modules get it through the ``ray_cluster`` fixture of ``conftest.py``, which shares
    one among the modules that ask for the same shape.

    Args:
        num_cpus: Logical CPUs of the local Ray.
        env_vars: Environment variables for every Ray worker (none when None).
    """
    import ray

    if ray.is_initialized():
        # A background thread of an earlier module (e.g. a Ray Data prefetcher) can
        # auto-initialise Ray in this process after that module's shutdown.
        ray.shutdown()
    ray.init(
        address="local",
        num_cpus=num_cpus,
        include_dashboard=False,
        object_store_memory=200 * 2**20,
        log_to_driver=False,
        runtime_env={"env_vars": dict(env_vars)} if env_vars else None,
    )


def read_records(record_dir: str, event: str) -> list[dict[str, Any]]:
    """Records written by :class:`ProbeRegressor` for ``event``, sorted by rank."""
    import glob
    import json
    import os

    out = []
    for path in sorted(glob.glob(os.path.join(record_dir, f"*-{event}.json"))):
        with open(path) as handle:
            out.append(json.load(handle))
    return sorted(out, key=lambda r: r["rank"])


class ProbeRegressor(TinyRegressor):
    """:class:`TinyRegressor` that writes what each worker saw into ``record_dir``.

    Records (one JSON file per rank and event, ``rank<r>-<event>.json``):
    ``fit_start`` (weights as loaded, requires_grad per parameter, stepping estimate),
    ``train_start`` (global step after any resume) and
    ``train_end`` (global step, final learning rate, weights). With ``warmup_steps`` it
    uses a warmup + cosine schedule stepping per optimizer step, down to ``lr * floor``.
    """

    def __init__(self, record_dir: str, hidden_dim: int = 8, lr: float = 1e-2,
                 warmup_steps: int = 0, floor: float = 0.1, exit_at_step: int | None = None,
                 exit_marker: str | None = None, exit_wait_for: str | None = None,
                 step_sleep: float = 0.0,
                 tag: str = "") -> None:
        super().__init__(hidden_dim=hidden_dim, lr=lr)
        self.record_dir = record_dir
        self.warmup_steps = warmup_steps
        self.floor = floor
        self.exit_at_step = exit_at_step
        self.exit_marker = exit_marker
        self.exit_wait_for = exit_wait_for
        self.step_sleep = step_sleep
        self.tag = tag

    def _write(self, event: str, extra: dict[str, Any]) -> None:
        import json
        import os

        record = {
            "rank": self.global_rank,
            "weights": {k: v.detach().flatten().tolist() for k, v in self.state_dict().items()},
            "requires_grad": {n: p.requires_grad for n, p in self.named_parameters()},
            **extra,
        }
        path = os.path.join(self.record_dir, f"rank{self.global_rank}-{event}.json")
        with open(path + ".tmp", "w") as handle:
            json.dump(record, handle)
        os.replace(path + ".tmp", path)

    def on_fit_start(self) -> None:
        self._write("fit_start", {
            "global_step": self.trainer.global_step,
            "estimated_stepping_batches": self.trainer.estimated_stepping_batches,
        })

    def on_train_start(self) -> None:
        # After Lightning restored a checkpoint's loop state (unlike on_fit_start).
        self._write("train_start", {"global_step": self.trainer.global_step,
                                    "epoch": self.trainer.current_epoch})

    def on_train_batch_start(self, batch, batch_idx):
        import os

        # Simulated crash: once (marker file), the last rank dies mid-epoch without cleanup.
        if (self.exit_at_step is not None and self.trainer.global_step == self.exit_at_step
                and self.global_rank == self.trainer.world_size - 1
                and self.exit_marker and not os.path.exists(self.exit_marker)):
            open(self.exit_marker, "w").close()
            if self.exit_wait_for:
                # Die only once Ray's controller has registered the last checkpoint (its
                # snapshot file exists), so the retry has something to start from.
                import time

                deadline = time.monotonic() + 120
                while not os.path.exists(self.exit_wait_for) and time.monotonic() < deadline:
                    time.sleep(0.2)
            os._exit(1)

    def on_train_end(self) -> None:
        self._write("train_end", {
            "global_step": self.trainer.global_step,
            "lr": self.trainer.optimizers[0].param_groups[0]["lr"],
            "num_training_batches": self.trainer.num_training_batches,
        })

    def training_step(self, batch, batch_idx):
        import json
        import os

        loss = super().training_step(batch, batch_idx)
        if self.step_sleep:  # stretches a run so a test can interrupt it in the middle
            import time

            time.sleep(self.step_sleep)
        if self.global_rank == 0:  # the loss curve, one line per optimizer step
            with open(os.path.join(self.record_dir, "losses.jsonl"), "a") as handle:
                handle.write(json.dumps({"tag": self.tag, "step": self.trainer.global_step,
                                         "loss": float(loss)}) + "\n")
        return loss

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.lr)
        if not self.warmup_steps:
            return optimizer
        import math

        total = int(self.trainer.estimated_stepping_batches)
        warmup, floor = self.warmup_steps, self.floor

        def factor(step: int) -> float:
            if step < warmup:
                return (step + 1) / warmup
            progress = min(1.0, (step - warmup) / max(1, total - warmup))
            return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
        return {"optimizer": optimizer,
                "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def create_probe_model(record_dir: str, **kwargs: Any) -> ProbeRegressor:
    """Factory for :class:`ProbeRegressor`."""
    return ProbeRegressor(record_dir, **kwargs)
