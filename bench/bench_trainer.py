"""LightningTrainer vs a hand-written Ray Train + Lightning loop vs plain Lightning.

Arms (``--arms``, alternated in this order every round, one Ray session):

- ``ours``: ``LightningTrainer(LightningTrainerParam(...)).train()`` with ``--workers`` CPU
  workers (GPU with ``--gpu``), default settings: a shard that fits is kept in memory.
- ``stream``: the same with ``MA_TRAINER_INMEMORY=0``: our streaming path.
- ``raw``: a ``ray.train.torch.TorchTrainer`` whose loop builds the same LightningModule and a
  Lightning ``Trainer`` (from ``lightning.pytorch`` where the ``lightning`` package is installed,
  since Ray then builds its classes on it; else from ``pytorch_lightning``; the module and the
  clock follow) with ``RayDDPStrategy``, ``RayLightningEnvironment``,
  ``RayTrainReportCallback`` and ``prepare_trainer``, fed by
  ``get_dataset_shard(...).iter_torch_batches(batch_size, local_shuffle_buffer_size)`` with the
  same shuffle buffer as ours (``num_shuffle_batches x batch_size`` rows): Ray's recipe.
- ``ours1``: ``ours`` with one worker.
- ``plain``: one process, one torch thread, no Ray: ``pl.Trainer(...).fit()`` over
  ``DataLoader(TensorDataset(x, y), batch_size, shuffle=True)`` on the same rows.
- ``warm``: not a product path but the floor a training could reach if its worker processes
  were kept between trainings of a run: ``--workers`` Ray actors started once per benchmark
  (torch and Lightning imported, one torch thread each, no CPUs reserved so they never starve
  the other arms), each round a ``pl.Trainer`` with Lightning's own ``DDPStrategy`` (gloo,
  ``LightningEnvironment``; the process group of the first round is kept) fits the same module
  over ``DataLoader(TensorDataset(x, y), batch_size, shuffle=True)``, sharded by Lightning's
  distributed sampler. No checkpoint is written or reported. The actors' start is printed once
  and is not part of any round.

All arms: the same module (an MLP on ``--features`` float32 features), the same rows
(``--rows`` training rows, a tenth of that for validation; materialised Ray datasets for the
Ray arms), the same batch size and epochs, and the Lightning settings our trainer applies by
default (``max_epochs``, ``num_sanity_val_steps=0``, ``enable_progress_bar=False``,
``enable_checkpointing=False`` as ours derives it when no ``ModelCheckpoint`` is given).

Measured on the workers by one tiny Lightning callback present in every arm: the start time
of every training batch. Steady-state throughput = rows / time over consecutive batches of
one epoch, skipping the first ``--warmup`` batches of each epoch; summed over the ranks. Also
the rows/s of the median batch interval (less sensitive to bursts of other jobs' load).
Phases of a Ray arm's wall time, from the driver, a bench-only Ray Train controller callback
and the workers: driver-side construction; controller start; placement group and worker
processes (start, imports) until the workers are ready; process group (and train context);
train function start; model factory to ``fit`` start (ours: reading the shard into memory,
which includes the dataset split coordinator's start; raw: building the Trainer);
``fit`` start to first batch (raw: the split coordinator and first read happen here);
training loop; teardown (report, worker group shutdown, return to the driver).
Around each round ``_cpu.CpuMeter`` counts the CPU-seconds the machine was busy and which
kinds of process spent them (the last round's, per Ray arm), so a fixed cost shows up as work
done by new processes or as cores left idle.

Targets: steady rows/s ours/raw >= 1.5; whole train() ours/raw <= 0.8; one worker: ours
(model factory to train end, on the worker) / plain (``fit()``) <= 1.5.

    .venv/bin/python bench/bench_trainer.py [--rows 40000] [--epochs 3] [--pairs 3] [--gpu]
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
import socket
import sys
import tempfile
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pytorch_lightning as pl  # noqa: E402
import torch  # noqa: E402
from _common import NOISE_NOTE, median, print_table, write_results  # noqa: E402
from _cpu import CpuMeter, print_cpu  # noqa: E402
from torch import nn  # noqa: E402

TARGET_THROUGHPUT = 1.5  # steady rows/s, ours / raw, at least
TARGET_WALL = 0.8  # whole train() / fit() wall time, ours / raw, at most
TARGET_ONE_WORKER = 1.5  # one worker: ours (factory to train end) / plain fit(), at most
ARMS = ("ours", "stream", "raw", "ours1", "plain", "warm")
DEFAULT_ARMS = ("ours", "stream", "raw", "ours1", "plain")  # warm: ask for it (--arms)


# ---------------------------------------------------------------------------------------------
# Shared by the arms (pickled by value: this file runs as __main__)
# ---------------------------------------------------------------------------------------------


def _xy(batch):
    """A batch as (x, y): a dict from Ray Data, a (x, y) list from a TensorDataset loader."""
    return (batch["x"], batch["y"]) if isinstance(batch, dict) else (batch[0], batch[1])


class _BenchMLPBody:
    """BenchMLP's body, on either Lightning package (see :func:`raw_lightning`)."""

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

    def _loss(self, batch) -> torch.Tensor:
        x, y = _xy(batch)
        return nn.functional.mse_loss(self(x), y)

    def training_step(self, batch, batch_idx):
        loss = self._loss(batch)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", self._loss(batch), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.lr)


class BenchMLP(_BenchMLPBody, pl.LightningModule):
    """A small MLP regressor; remembers when the factory built it (for the phase breakdown)."""


def create_bench_model(features: int = 32, hidden: int = 128, lr: float = 1e-3) -> BenchMLP:
    return BenchMLP(features=features, hidden=hidden, lr=lr)


class _BatchClockBody:
    """BatchClock's body, on either Lightning package (see :func:`raw_lightning`)."""

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
        self.batches.append((trainer.current_epoch, time.time(), int(_xy(batch)[0].shape[0])))

    def on_train_end(self, trainer, pl_module) -> None:
        import psutil

        record = {
            "rank": trainer.global_rank,
            "process_started_at": psutil.Process().create_time(),
            "created_at": self.created_at,
            "fit_start": self.fit_start,
            "train_end": time.time(),
            "num_training_batches": trainer.num_training_batches,
            "val_loss": float(trainer.callback_metrics.get("val_loss", float("nan"))),
            "batches": self.batches,
        }
        path = os.path.join(self.out_dir, f"{self.tag}-rank{trainer.global_rank}.json")
        with open(path, "w") as handle:
            json.dump(record, handle)


class BatchClock(_BatchClockBody, pl.Callback):
    """Records the start time and row count of every training batch; one JSON file per rank."""


def raw_lightning():
    """The Lightning package a hand-written job uses with Ray's classes: the one Ray builds them
    on (``lightning.pytorch`` when the ``lightning`` package is installed, as on the GPU
    check's CUDA image), and the model class and clock built on it."""
    try:
        import lightning.pytorch as raw_pl
    except ModuleNotFoundError:
        return pl, BenchMLP, BatchClock
    return (raw_pl, type("BenchMLP", (_BenchMLPBody, raw_pl.LightningModule), {}),
            type("BatchClock", (_BatchClockBody, raw_pl.Callback), {}))


def _phase_clock_class():
    """A bench-only Ray Train V2 controller / worker-group callback recording when each stage
    of a run starts (Ray runs user-given internal callbacks after its own, in order)."""
    from ray.train.v2._internal.execution.callback import ControllerCallback, WorkerGroupCallback

    class PhaseClock(ControllerCallback, WorkerGroupCallback):
        def __init__(self, path: str) -> None:
            self.path = path
            self.times: dict[str, float] = {}

        def _mark(self, name: str) -> None:
            self.times.setdefault(name, time.time())
            with open(self.path, "w") as handle:
                json.dump(self.times, handle)

        def after_controller_start(self, train_run_context) -> None:
            self._mark("controller_started")

        def before_worker_group_start(self, worker_group_context) -> None:
            self._mark("worker_group_start")

        def before_init_train_context(self, workers):
            # After Ray's dataset callback built the split (its coordinator starts lazily).
            self._mark("workers_ready")
            return {}

        def after_worker_group_start(self, worker_group) -> None:
            # After Ray's backend callback set up the torch process group.
            self._mark("process_group_ready")

        def before_worker_group_shutdown(self, worker_group) -> None:
            self._mark("shutdown_start")

        def after_worker_group_shutdown(self, worker_group_context) -> None:
            self._mark("shutdown_end")

    return PhaseClock


def raw_train_loop(config: dict) -> None:
    """The hand-written Ray Train + Lightning loop (Ray's documented recipe)."""
    import ray.train
    from ray.train.lightning import (
        RayDDPStrategy,
        RayLightningEnvironment,
        RayTrainReportCallback,
        prepare_trainer,
    )

    raw_pl, model_class, _ = raw_lightning()
    model = model_class(**config["model_kwargs"])
    batch_size = config["batch_size"]
    train_batches = ray.train.get_dataset_shard("train").iter_torch_batches(
        batch_size=batch_size, local_shuffle_buffer_size=config["shuffle_buffer_rows"])
    val_batches = ray.train.get_dataset_shard("val").iter_torch_batches(batch_size=batch_size)
    trainer = raw_pl.Trainer(
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


def make_arrays(rows: int, features: int, seed: int):
    import numpy as np

    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, features)).astype(np.float32)
    w = np.linspace(-1, 1, features, dtype=np.float32)
    y = (x @ w + 0.01 * rng.standard_normal(rows)).astype(np.float32)
    return x, y


def build_datasets(arrays: dict, blocks: int = 8):
    import pyarrow as pa
    import ray.data
    from ray.data.extensions import ArrowTensorArray

    def split(t, parts: int):
        step = -(-t.num_rows // parts)
        return [t.slice(i, step) for i in range(0, t.num_rows, step)]

    def dataset(name: str, parts: int):
        x, y = arrays[name]
        table = pa.table({"x": ArrowTensorArray.from_numpy(x), "y": y})
        return ray.data.from_arrow(split(table, parts)).materialize()

    return dataset("train", blocks), dataset("val", 2)


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


def summarize(records: list[dict], t_start: float, t_fit: float, t_end: float, warmup: int,
              clock: dict | None = None) -> dict:
    per_rank = [steady_rows_per_s(r, warmup) for r in records]
    first_batch = max(r["batches"][0][1] for r in records)
    created = min(r["created_at"] for r in records)
    fit_start = max(r["fit_start"] for r in records)
    train_end = max(r["train_end"] for r in records)
    summary = {
        "wall_s": t_end - t_start,
        "rows_per_s": sum(p[0] for p in per_rank),
        "rows_per_s_by_rank": [p[0] for p in per_rank],
        "median_batch_rows_per_s": sum(p[3] for p in per_rank),
        "steady_rows": sum(p[1] for p in per_rank),
        "num_training_batches": [r["num_training_batches"] for r in records],
        "val_loss": median([r["val_loss"] for r in records]),
        # On the worker: model factory to the end of training (ingest + Lightning fit).
        "worker_fit_s": train_end - created,
    }
    phases = {"construct_s": t_fit - t_start}
    if clock and {"controller_started", "worker_group_start", "workers_ready",
                  "process_group_ready"} <= set(clock):
        phases["controller_start_s"] = clock["controller_started"] - t_fit
        phases["controller_to_worker_group_s"] = (clock["worker_group_start"]
                                                  - clock["controller_started"])
        phases["placement_group_and_worker_processes_s"] = (clock["workers_ready"]
                                                            - clock["worker_group_start"])
        phases["process_group_s"] = clock["process_group_ready"] - clock["workers_ready"]
        phases["train_fn_start_s"] = created - clock["process_group_ready"]
    else:
        phases["dispatch_to_factory_s"] = created - t_fit
    phases["factory_to_fit_start_s"] = fit_start - created
    phases["fit_start_to_first_batch_s"] = first_batch - fit_start
    phases["training_loop_s"] = train_end - first_batch
    if clock and "shutdown_end" in clock:
        phases["train_end_to_shutdown_end_s"] = clock["shutdown_end"] - train_end
        phases["shutdown_end_to_driver_s"] = t_end - clock["shutdown_end"]
    else:
        phases["return_to_driver_s"] = t_end - train_end
    summary["phases"] = phases
    # Everything but the training loop: what a second training in a run pays again.
    summary["fixed_s"] = summary["wall_s"] - phases["training_loop_s"]
    # Fresh worker processes only: when a pooled Ray worker was reused this is negative.
    if clock and "worker_group_start" in clock:
        summary["worker_process_start_after_group_start_s"] = (
            max(r["process_started_at"] for r in records) - clock["worker_group_start"])
    return summary


def plain_fit(arrays: dict, args, trainer_kwargs: dict, model_kwargs: dict, tag: str,
              work: str) -> dict:
    """Plain single-process Lightning: DataLoader over TensorDatasets, one torch thread."""
    from torch.utils.data import DataLoader, TensorDataset

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        t_start = time.time()
        train = DataLoader(TensorDataset(*map(torch.from_numpy, arrays["train"])),
                           batch_size=args.batch_size, shuffle=True)
        val = DataLoader(TensorDataset(*map(torch.from_numpy, arrays["val"])),
                         batch_size=args.batch_size)
        model = create_bench_model(**model_kwargs)
        trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False,
                             enable_checkpointing=False, enable_model_summary=False,
                             callbacks=[BatchClock(work, tag)], **trainer_kwargs)
        t_fit = time.time()
        trainer.fit(model, train_dataloaders=train, val_dataloaders=val)
        t_end = time.time()
    finally:
        torch.set_num_threads(threads)
    with open(os.path.join(work, f"{tag}-rank0.json")) as handle:
        record = json.load(handle)
    summary = summarize([record], t_start, t_fit, t_end, args.warmup)
    summary["fit_s"] = t_end - t_fit
    return summary


def _warm_pool_class():
    """The ``warm`` arm's worker: a Ray actor that keeps torch, Lightning and the process group
    between fits (a measurement of the floor, not a product path)."""
    import ray

    @ray.remote(num_cpus=0)
    class WarmWorker:
        def __init__(self) -> None:
            torch.set_num_threads(1)  # what a 1-CPU Ray Train worker gets

        def ready(self) -> float:
            return time.time()

        def fit(self, rank: int, world: int, port: int, arrays: dict, model_kwargs: dict,
                trainer_kwargs: dict, batch_size: int, clock: BatchClock) -> None:
            from pytorch_lightning.plugins.environments import LightningEnvironment
            from pytorch_lightning.strategies import DDPStrategy
            from torch.utils.data import DataLoader, TensorDataset

            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                              WORLD_SIZE=str(world), NODE_RANK="0", LOCAL_RANK=str(rank))
            model = create_bench_model(**model_kwargs)
            train = DataLoader(TensorDataset(*map(torch.from_numpy, arrays["train"])),
                               batch_size=batch_size, shuffle=True)
            val = DataLoader(TensorDataset(*map(torch.from_numpy, arrays["val"])),
                             batch_size=batch_size)
            trainer = pl.Trainer(
                accelerator="cpu", devices=world, num_nodes=1, logger=False,
                strategy=DDPStrategy(process_group_backend="gloo",
                                     cluster_environment=LightningEnvironment()),
                enable_checkpointing=False, enable_model_summary=False, callbacks=[clock],
                **trainer_kwargs)
            trainer.fit(model, train_dataloaders=train, val_dataloaders=val)

    return WarmWorker


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=40_000, help="training rows")
    parser.add_argument("--features", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--num-shuffle-batches", type=int, default=10)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--pairs", type=int, default=3, help="rounds of the arms, alternated")
    parser.add_argument("--arms", default=",".join(DEFAULT_ARMS),
                        help=f"comma-separated subset of {','.join(ARMS)}")
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
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = sorted(set(arms) - set(ARMS))
    if unknown:
        parser.error(f"--arms: unknown {unknown}; choose from {list(ARMS)}")

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

    ENV_SWITCH = "MA_TRAINER_INMEMORY"  # the user's switch for in-memory ingest (README)
    gpus = torch.cuda.device_count() if args.gpu else 0
    if args.gpu and gpus < 1:
        raise SystemExit("--gpu: torch sees no CUDA device on this machine")
    ray_tmp = tempfile.mkdtemp(prefix="ufb-ray-", dir="/tmp")
    work = tempfile.mkdtemp(prefix="ufbench-trainer-")
    PhaseClock = _phase_clock_class()

    workers = args.workers
    trainer_kwargs: dict = {"max_epochs": args.epochs, "num_sanity_val_steps": 0,
                            "enable_progress_bar": False}
    if args.gpu:
        workers = min(workers, gpus)
        trainer_kwargs["precision"] = "bf16-mixed"
    model_kwargs = {"features": args.features, "hidden": args.hidden}
    shuffle_rows = args.num_shuffle_batches * args.batch_size or None

    runs: dict[str, list[dict]] = {arm: [] for arm in arms}
    profile_text = None
    try:
        ray.init(address="local", num_cpus=4, include_dashboard=False,
                 object_store_memory=512 * 2**20, logging_level="ERROR", log_to_driver=False,
                 _temp_dir=ray_tmp)
        ray.data.DataContext.get_current().enable_progress_bars = False
        arrays = {"train": make_arrays(args.rows, args.features, 0),
                  "val": make_arrays(max(args.rows // 10, 64), args.features, 1)}
        train_ds, val_ds = build_datasets(arrays)
        counter = {"n": 0}

        def new_tag(arm: str) -> str:
            counter["n"] += 1
            return f"ufb{os.getpid()}-{arm}-{counter['n']}"

        def scaling(n: int) -> ScalingConfig:
            return ScalingConfig(num_workers=n, use_gpu=args.gpu)

        def run_config(tag: str) -> RunConfig:
            return RunConfig(name=tag, storage_path=os.path.join(work, "ray"),
                             callbacks=[PhaseClock(os.path.join(work, f"{tag}-phases.json"))])

        def collect(tag: str, n: int) -> tuple[list[dict], dict]:
            records = []
            for path in sorted(glob.glob(os.path.join(work, f"{tag}-rank*.json"))):
                with open(path) as handle:
                    records.append(json.load(handle))
            if len(records) != n:
                raise RuntimeError(f"{tag}: {len(records)} worker records, expected {n}")
            clock_path = os.path.join(work, f"{tag}-phases.json")
            clock = {}
            if os.path.exists(clock_path):
                with open(clock_path) as handle:
                    clock = json.load(handle)
            return records, clock

        def ours(n: int, switch: str | None = None) -> dict:
            tag = new_tag("ours")
            previous = os.environ.get(ENV_SWITCH)
            if switch is not None:
                os.environ[ENV_SWITCH] = switch
            try:
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
                    scaling_config=scaling(n),
                )
                t_fit = time.time()
                result = trainer.train()
                t_end = time.time()
            finally:
                if previous is None:
                    os.environ.pop(ENV_SWITCH, None)
                else:
                    os.environ[ENV_SWITCH] = previous
            assert result["checkpoint_path"], result
            records, clock = collect(tag, n)
            summary = summarize(records, t_start, t_fit, t_end, args.warmup, clock=clock)
            summary["ingest"] = trainer._ingest.reason
            return summary

        def raw() -> dict:
            tag = new_tag("raw")
            t_start = time.time()
            trainer = TorchTrainer(
                raw_train_loop,
                train_loop_config={
                    "model_kwargs": model_kwargs,
                    "batch_size": args.batch_size,
                    "shuffle_buffer_rows": shuffle_rows,
                    "trainer_kwargs": trainer_kwargs,
                    "clock": raw_lightning()[2](work, tag),
                },
                scaling_config=scaling(workers),
                run_config=run_config(tag),
                datasets={"train": train_ds, "val": val_ds},
            )
            t_fit = time.time()
            result = trainer.fit()
            t_end = time.time()
            assert result.checkpoint is not None, result
            records, clock = collect(tag, workers)
            return summarize(records, t_start, t_fit, t_end, args.warmup, clock=clock)

        pool: dict = {}

        def warm() -> dict:
            if not pool:  # once per benchmark, outside every round
                t0 = time.time()
                actors = [_warm_pool_class().remote() for _ in range(workers)]
                ray.get([a.ready.remote() for a in actors])
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", 0))
                    pool.update(actors=actors, port=probe.getsockname()[1],
                                arrays=ray.put(arrays))
                print(f"  warm arm: {workers} worker processes up, torch and Lightning "
                      f"imported, in {time.time() - t0:.1f} s (once, not in any round)",
                      flush=True)
            tag = new_tag("warm")
            t_start = time.time()
            calls = [actor.fit.remote(rank, workers, pool["port"], pool["arrays"], model_kwargs,
                                      trainer_kwargs, args.batch_size, BatchClock(work, tag))
                     for rank, actor in enumerate(pool["actors"])]
            t_fit = time.time()
            ray.get(calls)
            t_end = time.time()
            records, _ = collect(tag, workers)
            return summarize(records, t_start, t_fit, t_end, args.warmup)

        arm_fns = {
            "ours": lambda: ours(workers),
            "stream": lambda: ours(workers, switch="0"),
            "raw": raw,
            "ours1": lambda: ours(1),
            "plain": lambda: plain_fit(arrays, args, trainer_kwargs, model_kwargs,
                                       new_tag("plain"), work),
            "warm": warm,
        }

        # The first Train run of a session pays one-off costs (worker imports, the
        # controller, Ray Data's executor); spend them outside the measured rounds.
        for _ in range(args.warmup_runs):
            summary = raw() if "raw" in arms else arm_fns["ours"]()
            print(f"  warm-up run (not reported): wall {summary['wall_s']:.1f} s", flush=True)

        for i in range(args.pairs):
            for name in arms:
                with CpuMeter() as meter:
                    summary = arm_fns[name]()
                summary["cpu"] = meter.result()
                runs[name].append(summary)
                print(f"  round {i + 1} {name}: wall {summary['wall_s']:.1f} s, steady "
                      f"{summary['rows_per_s']:.0f} rows/s, val_loss {summary['val_loss']:.4f}",
                      flush=True)

        if args.profile:
            profiler = cProfile.Profile()
            profiler.enable()
            ours(workers)
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

    results = report(args, arms, runs, workers)
    results["driver_profile"] = profile_text
    if profile_text:
        print("\ncProfile of the driver side of one extra run of our arm (cumulative):")
        print(profile_text)
    write_results(args.results_name or ("trainer_gpu" if args.gpu else "trainer"), results)
    return results


def _paired(runs: dict, a: str, b: str, key_a: str, key_b: str | None = None) -> list[float]:
    key_b = key_b or key_a
    return [x[key_a] / y[key_b] for x, y in zip(runs[a], runs[b], strict=True)]


def report(args, arms: list[str], runs: dict[str, list[dict]], workers: int) -> dict:
    """Print the tables and the verdicts; return the JSON payload."""
    print_table(
        f"{args.rows} rows x {args.features} features, MLP {args.features}-{args.hidden}-"
        f"{args.hidden}-1, batch {args.batch_size}, {args.epochs} epoch(s), {workers} "
        f"{'GPU' if args.gpu else 'CPU'} worker(s) (ours1: 1), medians over {args.pairs} rounds",
        ["arm", "wall s", "steady rows/s", "median-batch rows/s", "worker fit s", "val_loss"],
        [[arm, median([r["wall_s"] for r in runs[arm]]),
          median([r["rows_per_s"] for r in runs[arm]]),
          median([r["median_batch_rows_per_s"] for r in runs[arm]]),
          median([r.get("fit_s", r["worker_fit_s"]) for r in runs[arm]]),
          median([r["val_loss"] for r in runs[arm]])] for arm in arms],
    )
    ray_arms = [a for a in arms if a != "plain"]
    if ray_arms:
        names = list(dict.fromkeys(p for a in ray_arms for r in runs[a] for p in r["phases"]))
        print_table("median phases of the wall time (s)", ["phase", *ray_arms],
                    [[p, *[median([r["phases"].get(p, float("nan")) for r in runs[a]])
                           for a in ray_arms]] for p in names])
        print_table("fixed cost: wall time minus the training loop (s)",
                    ["arm", "median", "per round"],
                    [[a, median([r["fixed_s"] for r in runs[a]]),
                      " ".join(f"{r['fixed_s']:.2f}" for r in runs[a])] for a in ray_arms])
        # Where a round's CPU went (this process, the driver, is counted in the total only).
        print_cpu({a: runs[a] for a in ray_arms})
    results: dict = {"args": vars(args), "workers": workers, "arms": arms, "runs": runs,
                     "note": NOISE_NOTE, "ratios": {}, "targets": {
                         "throughput_ours_raw_min": TARGET_THROUGHPUT,
                         "wall_ours_raw_max": TARGET_WALL,
                         "one_worker_ours_plain_max": TARGET_ONE_WORKER}}
    comparisons = [
        ("ours", "raw", "rows_per_s", None, "steady rows/s ours/raw", TARGET_THROUGHPUT, ">="),
        ("ours", "raw", "median_batch_rows_per_s", None, "median-batch rows/s ours/raw", None,
         None),
        ("ours", "raw", "wall_s", None, "whole train() ours/raw", TARGET_WALL, "<="),
        ("stream", "raw", "rows_per_s", None, "steady rows/s stream/raw", None, None),
        ("stream", "raw", "wall_s", None, "whole train() stream/raw", None, None),
        ("ours", "stream", "rows_per_s", None, "steady rows/s ours/stream", None, None),
        ("ours", "warm", "fixed_s", None, "fixed cost ours/warm (kept worker processes)", None,
         None),
        ("ours", "warm", "rows_per_s", None, "steady rows/s ours/warm", None, None),
        ("ours1", "plain", "worker_fit_s", "fit_s",
         "one worker: ours (factory to train end) / plain fit()", TARGET_ONE_WORKER, "<="),
        ("ours1", "plain", "rows_per_s", None, "one worker: steady rows/s ours/plain", None,
         None),
        ("ours1", "plain", "wall_s", None, "one worker: whole train() / plain (incl. DataLoader)",
         None, None),
    ]
    lines = []
    for a, b, key_a, key_b, label, target, sense in comparisons:
        if a not in runs or b not in runs:
            continue
        ratios = _paired(runs, a, b, key_a, key_b)
        value = median(ratios)
        results["ratios"][label] = {"median": value, "per_round": ratios}
        verdict = ""
        if target is not None:
            ok = value >= target if sense == ">=" else value <= target
            results["ratios"][label]["target_met"] = ok
            verdict = f" (target {sense} {target}: {'met' if ok else 'MISSED'})"
        lines.append(f"{label}: {value:.3f} [{', '.join(f'{r:.2f}' for r in ratios)}]{verdict}")
    print("\nratios, median of the rounds' pairs [per round]:")
    for line in lines:
        print("  " + line)
    print(NOISE_NOTE)
    return results


if __name__ == "__main__":
    main()
