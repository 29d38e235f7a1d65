"""``initial_weights_path``: is storage read once? And what does the warm start cost?

A LightningModule with a few big ``Linear`` layers (about 200 MB of fp32 weights by default)
is saved with ``torch.save(model.state_dict())`` and trained by ``LightningTrainer`` on 2 CPU
workers with ``initial_weights_path="countfs://<file>"``. ``countfs`` is an fsspec
``LocalFileSystem`` subclass registered under that protocol (by the driver and by the model
factory, which runs first on every worker): every file it opens appends one JSON line per
open and per close (pid, bytes read, read calls, seconds open) next to the file, so the
workers' reads are visible from the driver.

Reported: opens, processes that opened the file, bytes read vs the file size (expected: one
open, one process, bytes = size), whether every rank started from the saved weights, and the
wall time of the warm-started run vs the same run without ``initial_weights_path``
(alternated), with the worker-side time from the model factory to ``on_fit_start`` (model
build, weight load and broadcast, DDP setup). Only the trainer's public API is used.

    .venv/bin/python bench/bench_initial_weights.py [--dim 3584] [--layers 4] [--pairs 2]
"""

from __future__ import annotations

import argparse
import glob
import json
import logging
import os
import shutil
import sys
import tempfile
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import fsspec  # noqa: E402
import pytorch_lightning as pl  # noqa: E402
import torch  # noqa: E402
from _common import NOISE_NOTE, median, print_table, write_results  # noqa: E402
from torch import nn  # noqa: E402

PROTOCOL = "countfs"
IN_FEATURES = 16


# ---------------------------------------------------------------------------------------------
# Counting filesystem (made in each process by register_countfs, which the factory calls)
# ---------------------------------------------------------------------------------------------


def _log(path: str, record: dict) -> None:
    if path.endswith(".reads.jsonl"):
        return
    with open(path + ".reads.jsonl", "a") as handle:
        handle.write(json.dumps({"t": time.time(), **record}) + "\n")


def register_countfs() -> None:
    """Register ``countfs://`` in this process.

    The classes are made here, in each process, rather than pickled: an fsspec filesystem
    class carries locks that cannot be pickled, while this function travels by value with
    the model factory.
    """
    from fsspec.implementations.local import LocalFileOpener, LocalFileSystem

    class CountingOpener(LocalFileOpener):
        """A local file that logs its open and, on close, the bytes read through it."""

        def __init__(self, path, mode, **kwargs):
            super().__init__(path, mode, **kwargs)
            self.bytes_read = 0
            self.read_calls = 0
            self.opened_at = time.time()
            self._logged = False
            _log(path, {"event": "open", "pid": os.getpid(), "mode": mode})

        def read(self, *args, **kwargs):
            data = super().read(*args, **kwargs)
            self.bytes_read += len(data)
            self.read_calls += 1
            return data

        def readinto(self, buffer):
            n = self.f.readinto(buffer)
            self.bytes_read += n or 0
            self.read_calls += 1
            return n

        def close(self):
            if not self._logged:
                self._logged = True
                _log(self.path, {"event": "close", "pid": os.getpid(), "bytes": self.bytes_read,
                                 "read_calls": self.read_calls,
                                 "seconds_open": time.time() - self.opened_at})
            return super().close()

    class CountingFS(LocalFileSystem):
        """``countfs:///abs/path``: the local file, with every open and byte read logged."""

        protocol = (PROTOCOL,)
        cachable = False  # a fresh instance per use: nothing cached between runs

        def _open(self, path, mode="rb", block_size=None, **kwargs):
            return CountingOpener(self._strip_protocol(path), mode, fs=self, **kwargs)

    fsspec.register_implementation(PROTOCOL, CountingFS, clobber=True)


# ---------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------


class BigModel(pl.LightningModule):
    """``Linear(16, dim)``, ``layers`` x ``Linear(dim, dim)``, ``Linear(dim, 1)``; plain SGD
    (no optimizer state, so checkpoints stay the size of the weights)."""

    def __init__(self, dim: int, layers: int, record_dir: str, tag: str,
                 expected_checksum: float | None) -> None:
        super().__init__()
        self.created_at = time.time()
        self.record_dir = record_dir
        self.tag = tag
        self.expected_checksum = expected_checksum
        self.inp = nn.Linear(IN_FEATURES, dim)
        self.big = nn.ModuleList(nn.Linear(dim, dim) for _ in range(layers))
        self.out = nn.Linear(dim, 1)

    def forward(self, x):
        h = self.inp(x)
        for layer in self.big:
            h = torch.relu(layer(h))
        return self.out(h).squeeze(-1)

    def training_step(self, batch, batch_idx):
        return nn.functional.mse_loss(self(batch["x"]), batch["y"])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-4)

    def on_fit_start(self) -> None:
        checksum = checksum_of(self.state_dict())
        record = {
            "rank": self.global_rank,
            "created_at": self.created_at,
            "fit_start": time.time(),
            "checksum": checksum,
            "matches_saved": (None if self.expected_checksum is None
                              else abs(checksum - self.expected_checksum) < 1e-3),
        }
        with open(os.path.join(self.record_dir, f"{self.tag}-rank{self.global_rank}.json"),
                  "w") as handle:
            json.dump(record, handle)


def checksum_of(state_dict: dict) -> float:
    return float(sum(v.double().sum().item() for k, v in state_dict.items() if "big.0" in k))


def create_big_model(dim: int, layers: int, record_dir: str, tag: str,
                     expected_checksum: float | None = None) -> BigModel:
    register_countfs()  # the factory runs first on every worker, before the weights load
    return BigModel(dim, layers, record_dir, tag, expected_checksum)


# ---------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------


def read_log(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path) as handle:
        return [json.loads(line) for line in handle]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dim", type=int, default=3584)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--pairs", type=int, default=2, help="warm/cold pairs, alternated")
    parser.add_argument("--warmup-runs", type=int, default=1,
                        help="unreported runs before the pairs (session warm-up)")
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=8)
    args = parser.parse_args(argv)

    warnings.filterwarnings("ignore")
    os.environ.pop("RAY_ADDRESS", None)
    for name in ("ray", "ray.data", "ray.train", "pytorch_lightning", "lightning"):
        logging.getLogger(name).setLevel(logging.WARNING)

    import numpy as np
    import ray
    import ray.data
    from ray.train import RunConfig, ScalingConfig

    from michelangelo.lib.trainer.torch.pytorch_lightning import (
        LightningTrainer,
        LightningTrainerParam,
    )

    register_countfs()
    work = tempfile.mkdtemp(prefix="ufbench-weights-")
    ray_tmp = tempfile.mkdtemp(prefix="ufb-ray-", dir="/tmp")
    weights = os.path.join(work, "baseline.pt")
    torch.manual_seed(123)
    baseline = BigModel(args.dim, args.layers, work, "baseline", None)
    state = baseline.state_dict()
    expected = checksum_of(state)
    torch.save(state, weights)
    del baseline, state
    size = os.path.getsize(weights)
    url = f"{PROTOCOL}://{weights}"
    log_path = weights + ".reads.jsonl"
    print(f"state dict: {size / 2**20:.1f} MiB at {url}", flush=True)

    ray.init(address="local", num_cpus=4, include_dashboard=False,
             object_store_memory=256 * 2**20, logging_level="ERROR", log_to_driver=False,
             _temp_dir=ray_tmp)
    ray.data.DataContext.get_current().enable_progress_bars = False
    runs: dict[str, list[dict]] = {"warm": [], "cold": []}
    reads_per_warm_run: list[dict] = []
    try:
        rng = np.random.default_rng(0)
        train = ray.data.from_items([
            {"x": rng.standard_normal(IN_FEATURES).astype(np.float32),
             "y": np.float32(rng.standard_normal())} for _ in range(args.rows)
        ]).materialize()
        counter = {"n": 0}

        def run(warm: bool) -> dict:
            counter["n"] += 1
            tag = f"{'warm' if warm else 'cold'}-{counter['n']}"
            before = len(read_log(log_path))
            t_start = time.time()
            trainer = LightningTrainer(
                trainer_param=LightningTrainerParam(
                    create_model_fn=create_big_model,
                    create_model_fn_kwargs={"dim": args.dim, "layers": args.layers,
                                            "record_dir": work, "tag": tag,
                                            "expected_checksum": expected if warm else None},
                    train_data=train,
                    val_data=None,
                    batch_size=args.batch_size,
                    initial_weights_path=url if warm else None,
                ),
                run_config=RunConfig(name=tag, storage_path=os.path.join(work, "ray")),
                scaling_config=ScalingConfig(num_workers=2),
            )
            result = trainer.train()
            wall = time.time() - t_start
            assert result["checkpoint_path"], result
            shutil.rmtree(os.path.join(work, "ray", tag), ignore_errors=True)
            records = []
            for path in sorted(glob.glob(os.path.join(work, f"{tag}-rank*.json"))):
                with open(path) as handle:
                    records.append(json.load(handle))
            events = read_log(log_path)[before:]
            closes = [e for e in events if e["event"] == "close"]
            reads = {
                "opens": sum(e["event"] == "open" for e in events),
                "processes": sorted({e["pid"] for e in events}),
                "bytes_read": sum(e["bytes"] for e in closes),
                "read_calls": sum(e["read_calls"] for e in closes),
                "seconds_open": sum(e["seconds_open"] for e in closes),
                "driver_opened": os.getpid() in {e["pid"] for e in events},
            }
            summary = {
                "wall_s": wall,
                "factory_to_fit_start_s": max(r["fit_start"] for r in records)
                - min(r["created_at"] for r in records),
                "ranks_match_saved": [r["matches_saved"] for r in records],
                "reads": reads,
            }
            print(f"  {tag}: wall {wall:.1f} s, factory->fit_start "
                  f"{summary['factory_to_fit_start_s']:.1f} s, opens {reads['opens']}, "
                  f"bytes {reads['bytes_read']}, ranks match {summary['ranks_match_saved']}",
                  flush=True)
            return summary

        # The first Train run of a session pays one-off costs; keep them out of the pairs.
        for _ in range(args.warmup_runs):
            print("  (warm-up run without initial weights, not reported)", flush=True)
            run(False)
        for _ in range(args.pairs):
            runs["warm"].append(run(True))
            runs["cold"].append(run(False))
    finally:
        ray.shutdown()
        shutil.rmtree(ray_tmp, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)

    reads_per_warm_run = [r["reads"] for r in runs["warm"]]
    read_once = all(r["opens"] == 1 and len(r["processes"]) == 1 and r["bytes_read"] == size
                    and not r["driver_opened"] for r in reads_per_warm_run)
    cold_reads_none = all(r["reads"]["opens"] == 0 for r in runs["cold"])
    all_match = all(all(r["ranks_match_saved"]) for r in runs["warm"])
    print_table(
        f"initial_weights_path: {size / 2**20:.1f} MiB state dict, 2 CPU workers, alternated",
        ["pair", "warm wall s", "cold wall s", "warm-cold s", "warm factory->fit s",
         "cold factory->fit s", "opens", "bytes read / size"],
        [[i + 1, w["wall_s"], c["wall_s"], w["wall_s"] - c["wall_s"],
          w["factory_to_fit_start_s"], c["factory_to_fit_start_s"], w["reads"]["opens"],
          f"{w['reads']['bytes_read']} / {size}"]
         for i, (w, c) in enumerate(zip(runs["warm"], runs["cold"], strict=True))],
    )
    med = {
        "warm_wall_s": median([r["wall_s"] for r in runs["warm"]]),
        "cold_wall_s": median([r["wall_s"] for r in runs["cold"]]),
        "warm_factory_to_fit_start_s": median([r["factory_to_fit_start_s"]
                                               for r in runs["warm"]]),
        "cold_factory_to_fit_start_s": median([r["factory_to_fit_start_s"]
                                               for r in runs["cold"]]),
    }
    print(f"\nstorage read once per run (1 open, by 1 worker process, bytes read == file size): "
          f"{'YES' if read_once else 'NO'}; runs without initial weights opened it: "
          f"{'never' if cold_reads_none else 'YES (unexpected)'}")
    print(f"every rank started from the saved weights: {'yes' if all_match else 'NO'}; the "
          f"read itself (open to close on rank 0): median "
          f"{median([r['seconds_open'] for r in reads_per_warm_run]):.2f} s")
    print(f"median wall: warm {med['warm_wall_s']:.1f} s vs cold {med['cold_wall_s']:.1f} s "
          f"(+{med['warm_wall_s'] - med['cold_wall_s']:.1f} s); factory -> on_fit_start: warm "
          f"{med['warm_factory_to_fit_start_s']:.1f} s vs cold "
          f"{med['cold_factory_to_fit_start_s']:.1f} s")
    print(NOISE_NOTE)
    results = {
        "args": vars(args),
        "file_bytes": size,
        "read_once": read_once,
        "cold_runs_never_opened": cold_reads_none,
        "all_ranks_match_saved": all_match,
        "medians": med,
        "runs": runs,
        "note": NOISE_NOTE,
    }
    write_results("initial_weights", results)
    return results


if __name__ == "__main__":
    main()
