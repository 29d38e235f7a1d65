"""What the console costs a training: live progress and the metrics record, on and off.

Arms, alternated in one process on one local Ray (A B A B ...):

- ``plain``: ``LightningTrainer(...).train()`` called outside any uniflow run: no progress
  is published and no metrics record is written.
- ``console``: the same call inside a uniflow task of a quiet run: global rank 0 publishes
  its progress about once a second, a driver thread reads and prints it, every logged metric
  is recorded into the task's folder, and the task's output goes to its log.

Reported: the median time of the fit loop on rank 0 (first to last training batch, so worker
start-up noise is left out) and of the whole ``train()`` call, and their ratios.

    python bench/bench_console.py [--rows 20000] [--epochs 2] [--repetitions 3]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import tempfile
import time

from _common import NOISE_NOTE, alternate, median, print_table, temp_storage, write_results


def _fit_clock_class():
    import pytorch_lightning as pl

    class FitClock(pl.Callback):
        """Rank 0 writes the seconds between its first and its last training batch."""

        def __init__(self, path: str) -> None:
            self.path = path
            self.start = None

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if self.start is None:
                self.start = time.perf_counter()

        def on_train_end(self, trainer, pl_module):
            if trainer.is_global_zero:
                with open(self.path, "w") as handle:
                    json.dump({"fit_s": time.perf_counter() - self.start,
                               "steps": trainer.global_step}, handle)

    return FitClock


def create_bench_model(features: int):
    import pytorch_lightning as pl
    import torch
    from torch import nn

    class Regressor(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(features, 64), nn.ReLU(), nn.Linear(64, 1))

        def training_step(self, batch, batch_idx):
            loss = nn.functional.mse_loss(self.net(batch["x"].float()).squeeze(-1),
                                          batch["y"].float())
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-3)

    return Regressor()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--features", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repetitions", type=int, default=3)
    args = parser.parse_args()

    import numpy as np
    import ray
    import ray.data
    from ray.train import RunConfig, ScalingConfig

    import michelangelo.uniflow.core as uniflow
    from michelangelo.lib.trainer.torch.pytorch_lightning import (
        LightningTrainer,
        LightningTrainerParam,
    )
    from michelangelo.uniflow.core import PlainReporter

    ray_tmp = tempfile.mkdtemp(prefix="ufb-ray-", dir="/tmp")
    work = tempfile.mkdtemp(prefix="ufbench-console-")
    ray.init(address="local", num_cpus=4, include_dashboard=False,
             object_store_memory=256 * 2**20, logging_level="ERROR", log_to_driver=False,
             _temp_dir=ray_tmp)
    ray.data.DataContext.get_current().enable_progress_bars = False
    FitClock = _fit_clock_class()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(args.rows, args.features)).astype(np.float32)
    y = (x.sum(axis=1) + 0.1 * rng.normal(size=args.rows)).astype(np.float32)
    data = ray.data.from_items([{"x": x[i], "y": y[i]} for i in range(args.rows)]).materialize()
    counter = {"n": 0}

    def train_once(arm: str) -> dict:
        counter["n"] += 1
        tag = f"ufb{os.getpid()}-{arm}-{counter['n']}"
        clock = os.path.join(work, f"{tag}.json")
        trainer = LightningTrainer(
            LightningTrainerParam(
                create_model_fn=create_bench_model,
                create_model_fn_kwargs={"features": args.features},
                train_data=data,
                val_data=None,
                batch_size=args.batch_size,
                lightning_trainer_kwargs={"max_epochs": args.epochs, "log_every_n_steps": 10,
                                          "enable_progress_bar": False, "logger": False,
                                          "callbacks": [FitClock(clock)]},
            ),
            run_config=RunConfig(name=tag, storage_path=os.path.join(work, "ray")),
            scaling_config=ScalingConfig(num_workers=args.workers),
        )
        start = time.perf_counter()
        trainer.train()
        total = time.perf_counter() - start
        with open(clock) as handle:
            fit = json.load(handle)
        return {"train_s": total, **fit}

    @uniflow.task()
    def console_task() -> dict:
        return train_once("console")

    console_lines = io.StringIO()

    def console_arm() -> dict:
        context = uniflow.Context(reporter=PlainReporter(console_lines, quiet=True))
        return context.run(console_task)

    try:
        with temp_storage("console"):
            results = alternate({"plain": lambda: train_once("plain"), "console": console_arm},
                                args.repetitions)
    finally:
        ray.shutdown()
    progress_lines = sum(1 for line in console_lines.getvalue().splitlines()
                         if "rows/s" in line)
    rows = []
    medians = {}
    for arm, values in results.items():
        medians[arm] = {key: median([v[key] for v in values]) for key in ("fit_s", "train_s")}
        rows.append([arm, medians[arm]["fit_s"], medians[arm]["train_s"], values[0]["steps"]])
    ratio_fit = medians["console"]["fit_s"] / medians["plain"]["fit_s"]
    ratio_train = medians["console"]["train_s"] / medians["plain"]["train_s"]
    print_table(f"console on/off, {args.rows} rows x {args.epochs} epochs, {args.workers} "
                f"workers, median of {args.repetitions}",
                ["arm", "fit loop s (rank 0)", "train() s", "steps"], rows)
    print(f"\nconsole / plain: fit loop {ratio_fit:.3f}, train() {ratio_train:.3f}; "
          f"progress lines printed by the console arm: {progress_lines}")
    print(NOISE_NOTE)
    write_results("console", {"args": vars(args), "runs": results, "medians": medians,
                              "ratio_fit": ratio_fit, "ratio_train": ratio_train})


if __name__ == "__main__":
    main()
