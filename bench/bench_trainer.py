"""LightningTrainer vs a hand-written Ray Train + Lightning loop: throughput and wall time.

OUR arm: ``LightningTrainer(LightningTrainerParam(...)).train()``.
RAW arm: a ``ray.train.torch.TorchTrainer`` whose loop builds the same LightningModule and a
``pytorch_lightning.Trainer`` with ``RayDDPStrategy``, ``RayLightningEnvironment``,
``RayTrainReportCallback`` and ``prepare_trainer``, fed by
``get_dataset_shard(...).iter_torch_batches(batch_size, local_shuffle_buffer_size)`` with the
same shuffle buffer as ours (``num_shuffle_batches x batch_size`` rows).

Both arms: the same module (an MLP on ``--features`` float32 features), the same materialised
Ray datasets (``--rows`` training rows, a tenth of that for validation), 2 CPU workers (or
GPU workers with ``--gpu``), the same batch size and epochs, and the same Lightning settings
our trainer applies by default (``max_epochs``, ``num_sanity_val_steps=0``,
``enable_progress_bar=False``; ``enable_checkpointing=False`` as ours derives it when no
``ModelCheckpoint`` is given). One Ray session, arms alternated (ours, raw, ours, raw, ...).

Measured on the workers by one tiny Lightning callback, present in both arms: the start time
of every training batch. Steady-state throughput = rows / time over consecutive batches of
one epoch, skipping the first ``--warmup`` batches of each epoch; summed over the ranks. Also
the rows/s of the median batch interval (less sensitive to bursts of other jobs' load) and
the p10/p50/p90 batch intervals of rank 0.
Also: the whole ``train()`` / ``fit()`` wall time on the driver, and its phases (driver-side
construction, dispatch until the model factory runs on the workers, Lightning setup until
the first batch, the training loop, and the return to the driver).

Targets: throughput ours/raw >= 0.97; wall time ours/raw <= 1.10.

    .venv/bin/python bench/bench_trainer.py [--rows 20000] [--epochs 2] [--pairs 3] [--gpu]
"""

from __future__ import annotations

import argparse
import cProfile
import glob
import io
import json
import logging
import os
import pstats
import shutil
import sys
import tempfile
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pytorch_lightning as pl  # noqa: E402
import torch  # noqa: E402
from _common import NOISE_NOTE, median, print_table, write_results  # noqa: E402
from torch import nn  # noqa: E402

TARGET_THROUGHPUT = 0.97
TARGET_WALL = 1.10


# ---------------------------------------------------------------------------------------------
# Shared by both arms (pickled by value: this file runs as __main__)
# ---------------------------------------------------------------------------------------------


class BenchMLP(pl.LightningModule):
    """A small MLP regressor; remembers when the factory built it (for the phase breakdown)."""

    def __init__(self, features: int = 32, hidden: int = 128, lr: float = 1e-3) -> None:
        super().__init__()
        self.created_at = time.time()
        self.net = nn.Sequential(
            nn.Linear(features, hidden), nn.ReLU(),
            nn.Linear(hidden, hidden), nn.ReLU(),
            nn.Linear(hidden, 1),
        )
        self.lr = lr

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).squeeze(-1)

    def _loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return nn.functional.mse_loss(self(batch["x"]), batch["y"])

    def training_step(self, batch, batch_idx):
        loss = self._loss(batch)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", self._loss(batch), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.lr)


def create_bench_model(features: int = 32, hidden: int = 128, lr: float = 1e-3) -> BenchMLP:
    return BenchMLP(features=features, hidden=hidden, lr=lr)


class BatchClock(pl.Callback):
    """Records the start time and row count of every training batch; one JSON file per rank."""

    def __init__(self, out_dir: str, tag: str) -> None:
        self.out_dir = out_dir
        self.tag = tag
        self.batches: list[tuple[int, float, int]] = []
        self.fit_start = None
        self.created_at = None

    def on_fit_start(self, trainer, pl_module) -> None:
        self.fit_start = time.time()
        self.created_at = getattr(pl_module, "created_at", None)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.batches.append((trainer.current_epoch, time.time(), int(batch["x"].shape[0])))

    def on_train_end(self, trainer, pl_module) -> None:
        record = {
            "rank": trainer.global_rank,
            "created_at": self.created_at,
            "fit_start": self.fit_start,
            "train_end": time.time(),
            "num_training_batches": trainer.num_training_batches,
            "batches": self.batches,
        }
        path = os.path.join(self.out_dir, f"{self.tag}-rank{trainer.global_rank}.json")
        with open(path, "w") as handle:
            json.dump(record, handle)


def raw_train_loop(config: dict) -> None:
    """The hand-written Ray Train + Lightning loop (Ray's documented recipe)."""
    import ray.train
    from ray.train.lightning import (
        RayDDPStrategy,
        RayLightningEnvironment,
        RayTrainReportCallback,
        prepare_trainer,
    )

    model = create_bench_model(**config["model_kwargs"])
    batch_size = config["batch_size"]
    train_batches = ray.train.get_dataset_shard("train").iter_torch_batches(
        batch_size=batch_size, local_shuffle_buffer_size=config["shuffle_buffer_rows"])
    val_batches = ray.train.get_dataset_shard("val").iter_torch_batches(batch_size=batch_size)
    trainer = pl.Trainer(
        devices="auto",
        accelerator="auto",
        strategy=RayDDPStrategy(),
        plugins=[RayLightningEnvironment()],
        callbacks=[RayTrainReportCallback(), config["clock"]],
        enable_checkpointing=False,
        **config["trainer_kwargs"],
    )
    trainer = prepare_trainer(trainer)
    trainer.fit(model, train_dataloaders=train_batches, val_dataloaders=val_batches)


# ---------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------


def build_datasets(rows: int, features: int, blocks: int = 8):
    import numpy as np
    import pyarrow as pa
    import ray.data
    from ray.data.extensions import ArrowTensorArray

    def table(n: int, seed: int):
        rng = np.random.default_rng(seed)
        x = rng.standard_normal((n, features)).astype(np.float32)
        w = np.linspace(-1, 1, features, dtype=np.float32)
        y = (x @ w + 0.01 * rng.standard_normal(n)).astype(np.float32)
        return pa.table({"x": ArrowTensorArray.from_numpy(x), "y": y})

    def split(t, parts: int):
        step = -(-t.num_rows // parts)
        return [t.slice(i, step) for i in range(0, t.num_rows, step)]

    train = ray.data.from_arrow(split(table(rows, 0), blocks)).materialize()
    val = ray.data.from_arrow(split(table(max(rows // 10, 64), 1), 2)).materialize()
    return train, val


def steady_rows_per_s(record: dict, warmup: int) -> tuple[float, int, float, float]:
    """Over consecutive batches of one epoch, after ``warmup``: (rows/s, rows, seconds,
    rows/s of the median batch). The last is robust to bursts of other jobs' load."""
    rows, seconds = 0, 0.0
    rates: list[float] = []
    by_epoch: dict[int, list[tuple[float, int]]] = {}
    for epoch, t, n in record["batches"]:
        by_epoch.setdefault(epoch, []).append((t, n))
    for batches in by_epoch.values():
        for (t0, n0), (t1, _) in zip(batches[warmup:], batches[warmup + 1:], strict=False):
            rows += n0
            seconds += t1 - t0
            if t1 > t0:
                rates.append(n0 / (t1 - t0))
    total = rows / seconds if seconds > 0 else float("nan")
    return total, rows, seconds, (median(rates) if rates else float("nan"))


def batch_ms_percentiles(record: dict, warmup: int) -> dict[str, float]:
    """p10 / p50 / p90 of the steady batch-to-batch intervals (ms) of one rank."""
    by_epoch: dict[int, list[float]] = {}
    for epoch, t, _ in record["batches"]:
        by_epoch.setdefault(epoch, []).append(t)
    gaps = sorted(1000 * (t1 - t0) for ts in by_epoch.values()
                  for t0, t1 in zip(ts[warmup:], ts[warmup + 1:], strict=False))
    if not gaps:
        return {}
    return {f"p{q}": gaps[min(len(gaps) - 1, len(gaps) * q // 100)] for q in (10, 50, 90)}


def summarize(records: list[dict], t_start: float, t_fit: float, t_end: float,
              warmup: int) -> dict:
    per_rank = [steady_rows_per_s(r, warmup) for r in records]
    first_batch = max(r["batches"][0][1] for r in records)
    return {
        "wall_s": t_end - t_start,
        "rows_per_s": sum(p[0] for p in per_rank),
        "rows_per_s_by_rank": [p[0] for p in per_rank],
        "median_batch_rows_per_s": sum(p[3] for p in per_rank),
        "batch_ms_rank0": batch_ms_percentiles(records[0], warmup),
        "steady_rows": sum(p[1] for p in per_rank),
        "num_training_batches": [r["num_training_batches"] for r in records],
        "phases": {
            "construct_s": t_fit - t_start,
            "dispatch_to_factory_s": min(r["created_at"] for r in records) - t_fit,
            "factory_to_first_batch_s": first_batch - min(r["created_at"] for r in records),
            "training_loop_s": max(r["train_end"] for r in records) - first_batch,
            "return_to_driver_s": t_end - max(r["train_end"] for r in records),
        },
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000, help="training rows")
    parser.add_argument("--features", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--num-shuffle-batches", type=int, default=10)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--pairs", type=int, default=3, help="ours/raw pairs, alternated")
    parser.add_argument("--warmup", type=int, default=10, help="batches skipped per epoch")
    parser.add_argument("--warmup-runs", type=int, default=1,
                        help="unreported runs before the pairs (session warm-up)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--gpu", action="store_true",
                        help="use_gpu=True, bf16-mixed, 1 worker per visible GPU (max --workers)")
    parser.add_argument("--results-name", default=None,
                        help="bench/results/<name>.json (default: trainer, or trainer_gpu)")
    parser.add_argument("--profile", action="store_true",
                        help="cProfile the driver side of one extra run of our arm")
    args = parser.parse_args(argv)

    warnings.filterwarnings("ignore")
    os.environ.pop("RAY_ADDRESS", None)
    os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
    for name in ("ray", "ray.data", "ray.train", "pytorch_lightning", "lightning"):
        logging.getLogger(name).setLevel(logging.WARNING)

    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from michelangelo.lib.trainer.torch.pytorch_lightning import (
        LightningTrainer,
        LightningTrainerParam,
    )

    gpus = torch.cuda.device_count() if args.gpu else 0
    if args.gpu and gpus < 1:
        raise SystemExit("--gpu: torch sees no CUDA device on this machine")
    ray_tmp = tempfile.mkdtemp(prefix="ufb-ray-", dir="/tmp")
    work = tempfile.mkdtemp(prefix="ufbench-trainer-")
    ray.init(address="local", num_cpus=4, include_dashboard=False,
             object_store_memory=512 * 2**20, logging_level="ERROR", log_to_driver=False,
             _temp_dir=ray_tmp)
    ray.data.DataContext.get_current().enable_progress_bars = False

    workers = args.workers
    trainer_kwargs: dict = {"max_epochs": args.epochs, "num_sanity_val_steps": 0,
                            "enable_progress_bar": False}
    if args.gpu:
        workers = min(workers, gpus)
        trainer_kwargs["precision"] = "bf16-mixed"
    model_kwargs = {"features": args.features, "hidden": args.hidden}
    shuffle_rows = args.num_shuffle_batches * args.batch_size or None

    runs: dict[str, list[dict]] = {"ours": [], "raw": []}
    try:
        train_ds, val_ds = build_datasets(args.rows, args.features)
        counter = {"n": 0}

        def scaling() -> ScalingConfig:
            return ScalingConfig(num_workers=workers, use_gpu=args.gpu)

        def run_config(tag: str) -> RunConfig:
            return RunConfig(name=tag, storage_path=os.path.join(work, "ray"))

        def collect(tag: str) -> list[dict]:
            records = []
            for path in sorted(glob.glob(os.path.join(work, f"{tag}-rank*.json"))):
                with open(path) as handle:
                    records.append(json.load(handle))
            if len(records) != workers:
                raise RuntimeError(f"{tag}: {len(records)} worker records, expected {workers}")
            return records

        def ours() -> dict:
            counter["n"] += 1
            tag = f"ufb{os.getpid()}-ours-{counter['n']}"
            t_start = time.time()
            trainer = LightningTrainer(
                trainer_param=LightningTrainerParam(
                    create_model_fn=create_bench_model,
                    create_model_fn_kwargs=model_kwargs,
                    train_data=train_ds,
                    val_data=val_ds,
                    batch_size=args.batch_size,
                    num_shuffle_batches=args.num_shuffle_batches,
                    lightning_trainer_kwargs={**trainer_kwargs,
                                              "callbacks": [BatchClock(work, tag)]},
                ),
                run_config=run_config(tag),
                scaling_config=scaling(),
            )
            t_fit = time.time()
            result = trainer.train()
            t_end = time.time()
            assert result["checkpoint_path"], result
            return summarize(collect(tag), t_start, t_fit, t_end, args.warmup)

        def raw() -> dict:
            counter["n"] += 1
            tag = f"ufb{os.getpid()}-raw-{counter['n']}"
            t_start = time.time()
            trainer = TorchTrainer(
                raw_train_loop,
                train_loop_config={
                    "model_kwargs": model_kwargs,
                    "batch_size": args.batch_size,
                    "shuffle_buffer_rows": shuffle_rows,
                    "trainer_kwargs": trainer_kwargs,
                    "clock": BatchClock(work, tag),
                },
                scaling_config=scaling(),
                run_config=run_config(tag),
                datasets={"train": train_ds, "val": val_ds},
            )
            t_fit = time.time()
            result = trainer.fit()
            t_end = time.time()
            assert result.checkpoint is not None, result
            return summarize(collect(tag), t_start, t_fit, t_end, args.warmup)

        # The first Train run of a session pays one-off costs (worker imports, the
        # controller, Ray Data's executor); spend them outside the measured pairs.
        for _ in range(args.warmup_runs):
            summary = raw()
            print(f"  warm-up run (raw arm, not reported): wall {summary['wall_s']:.1f} s",
                  flush=True)

        for i in range(args.pairs):
            for name, fn in (("ours", ours), ("raw", raw)):
                summary = fn()
                runs[name].append(summary)
                print(f"  pair {i + 1} {name}: wall {summary['wall_s']:.1f} s, steady "
                      f"{summary['rows_per_s']:.0f} rows/s", flush=True)

        profile_text = None
        if args.profile:
            profiler = cProfile.Profile()
            profiler.enable()
            ours()
            profiler.disable()
            stream = io.StringIO()
            pstats.Stats(profiler, stream=stream).sort_stats("cumulative").print_stats(25)
            profile_text = stream.getvalue()
    finally:
        ray.shutdown()
        shutil.rmtree(ray_tmp, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
        # RayTrainReportCallback leaves its (emptied) per-rank folders in the temp dir.
        for leftover in glob.glob(os.path.join(
                tempfile.gettempdir(), f"lightning_checkpoints-*-name=ufb{os.getpid()}-raw-*")):
            shutil.rmtree(leftover, ignore_errors=True)

    thr_ratios = [o["rows_per_s"] / r["rows_per_s"]
                  for o, r in zip(runs["ours"], runs["raw"], strict=True)]
    wall_ratios = [o["wall_s"] / r["wall_s"] for o, r in zip(runs["ours"], runs["raw"], strict=True)]
    batch_ratios = [o["median_batch_rows_per_s"] / r["median_batch_rows_per_s"]
                    for o, r in zip(runs["ours"], runs["raw"], strict=True)]
    thr_ratio, wall_ratio = median(thr_ratios), median(wall_ratios)
    print_table(
        f"LightningTrainer vs raw Ray Train + Lightning: {args.rows} rows x {args.features} "
        f"features, batch {args.batch_size}, {args.epochs} epoch(s), {workers} "
        f"{'GPU' if args.gpu else 'CPU'} worker(s), alternated",
        ["pair", "ours rows/s", "raw rows/s", "ours/raw", "median-batch ours/raw",
         "ours wall s", "raw wall s", "ours/raw"],
        [[i + 1, o["rows_per_s"], r["rows_per_s"], t, b, o["wall_s"], r["wall_s"], w]
         for i, (o, r, t, b, w) in enumerate(zip(runs["ours"], runs["raw"], thr_ratios,
                                                  batch_ratios, wall_ratios, strict=True))],
    )
    phase_names = list(runs["ours"][0]["phases"])
    med_phases = {arm: {p: median([s["phases"][p] for s in runs[arm]]) for p in phase_names}
                  for arm in runs}
    print_table("median phases of the wall time (s)", ["phase", "ours", "raw", "ours - raw"],
                [[p, med_phases["ours"][p], med_phases["raw"][p],
                  med_phases["ours"][p] - med_phases["raw"][p]] for p in phase_names])
    pct = {arm: {q: median([s["batch_ms_rank0"][q] for s in runs[arm] if s["batch_ms_rank0"]])
                 for q in ("p10", "p50", "p90")} for arm in runs}
    print_table("steady batch-to-batch interval on rank 0, median over runs (ms)",
                ["arm", "p10", "p50", "p90"],
                [[arm, pct[arm]["p10"], pct[arm]["p50"], pct[arm]["p90"]] for arm in runs])
    thr_ok, wall_ok = thr_ratio >= TARGET_THROUGHPUT, wall_ratio <= TARGET_WALL
    print(f"\nsteady-state throughput ours/raw (median of pairs): {thr_ratio:.3f} "
          f"(target >= {TARGET_THROUGHPUT}: {'met' if thr_ok else 'MISSED'}); rows/s of the "
          f"median batch, ours/raw: {median(batch_ratios):.3f} (less sensitive to load bursts)")
    print(f"train()/fit() wall time ours/raw (median of pairs): {wall_ratio:.3f} "
          f"(target <= {TARGET_WALL}: {'met' if wall_ok else 'MISSED'})")
    if profile_text:
        print("\ncProfile of the driver side of one extra run of our arm (cumulative):")
        print(profile_text)
    print(NOISE_NOTE)

    results = {
        "args": vars(args),
        "workers": workers,
        "throughput_ratio_median": thr_ratio,
        "wall_ratio_median": wall_ratio,
        "throughput_ratios": thr_ratios,
        "median_batch_throughput_ratio_median": median(batch_ratios),
        "median_batch_throughput_ratios": batch_ratios,
        "wall_ratios": wall_ratios,
        "targets": {"throughput_ratio_min": TARGET_THROUGHPUT, "wall_ratio_max": TARGET_WALL},
        "targets_met": {"throughput": thr_ok, "wall": wall_ok},
        "median_phases_s": med_phases,
        "batch_ms_rank0_median": pct,
        "runs": runs,
        "driver_profile": profile_text,
        "note": NOISE_NOTE,
    }
    write_results(args.results_name or ("trainer_gpu" if args.gpu else "trainer"), results)
    return results


if __name__ == "__main__":
    main()
