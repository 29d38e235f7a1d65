"""Ingest alone (no model): rows/s of each way a worker can turn its shard into batches.

What the streaming path's settings do, measured without Ray Train or a model in the way: one
Ray session, one materialised dataset (``--rows`` x ``--features`` float32 plus a float32
target, 8 blocks), iterated through ``Dataset.iterator()`` (the same ``DataIterator`` type a
Ray Train worker gets from ``get_dataset_shard``), one full pass per measurement, arms
alternated over ``--reps`` rounds, medians reported.

Arms:

- ``ray``: Ray's recipe (and our streaming path before tuning): ``iter_torch_batches(
  batch_size, local_shuffle_buffer_size=10 x batch_size)``, Ray's default ``prefetch_batches=1``.
- ``ray-prefetch0`` / ``ray-prefetch4``: the same with ``prefetch_batches`` 0 / 4.
- ``ray-noshuffle``: no local shuffle buffer.
- ``numpy``: ``iter_batches(batch_format="numpy", same buffer)`` + the same numpy-to-tensor
  conversion Ray's default collate applies, per column, instead of Ray's Arrow collate.
- ``stream``: our streaming path now (``SizedBatches``): numpy batches, ``prefetch_batches=4``.
- ``inmemory``: our in-memory path: the shard read once (timed apart, as ``inmemory-read``),
  then one epoch of full-shuffle batches from memory.

    .venv/bin/python bench/bench_ingest.py [--rows 40000] [--features 32] [--batch-size 64]
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import NOISE_NOTE, median, print_table, write_results  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=40_000)
    parser.add_argument("--features", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args(argv)

    warnings.filterwarnings("ignore")
    os.environ.pop("RAY_ADDRESS", None)
    logging.getLogger("ray").setLevel(logging.WARNING)
    import numpy as np
    import pyarrow as pa
    import ray
    from ray.data.extensions import ArrowTensorArray
    from ray.data.util.torch_utils import convert_ndarray_batch_to_torch_tensor_batch as to_tensor

    from michelangelo.lib.trainer.torch.pytorch_lightning._ingest._data import SizedBatches
    from michelangelo.lib.trainer.torch.pytorch_lightning._ingest._inmemory_data import (
        InMemoryBatches,
        drain_shard,
    )

    ray_tmp = tempfile.mkdtemp(prefix="ufb-ray-", dir="/tmp")
    bs = args.batch_size
    shuffle = 10 * bs
    timings: dict[str, list[float]] = {}
    try:
        ray.init(address="local", num_cpus=2, include_dashboard=False,
                 object_store_memory=256 * 2**20, logging_level="ERROR", log_to_driver=False,
                 _temp_dir=ray_tmp)
        ray.data.DataContext.get_current().enable_progress_bars = False
        rng = np.random.default_rng(0)
        x = rng.standard_normal((args.rows, args.features)).astype(np.float32)
        table = pa.table({"x": ArrowTensorArray.from_numpy(x), "y": x.sum(axis=1)})
        step = -(-args.rows // 8)
        ds = ray.data.from_arrow([table.slice(i, step)
                                  for i in range(0, args.rows, step)]).materialize()

        def consume(batches) -> None:
            for batch in batches:
                batch["x"].sum()  # touch the data, as a model would

        def stream(**kwargs):
            def run() -> None:
                consume(ds.iterator().iter_torch_batches(batch_size=bs, **kwargs))
            return run

        def stream_ours() -> None:
            consume(SizedBatches(ds.iterator(), args.rows, bs, shuffle))

        def stream_numpy() -> None:
            batches = ds.iterator().iter_batches(batch_size=bs, batch_format="numpy",
                                                 local_shuffle_buffer_size=shuffle)
            consume({k: to_tensor(v) for k, v in b.items()} for b in batches)

        def inmemory() -> None:
            start = time.perf_counter()
            data = InMemoryBatches(drain_shard(ds.iterator()), bs, shuffle=True, seed=0)
            timings.setdefault("inmemory-read", []).append(time.perf_counter() - start)
            consume(data)

        arms = {
            "ray": stream(local_shuffle_buffer_size=shuffle),
            "ray-prefetch0": stream(local_shuffle_buffer_size=shuffle, prefetch_batches=0),
            "ray-prefetch4": stream(local_shuffle_buffer_size=shuffle, prefetch_batches=4),
            "ray-noshuffle": stream(),
            "numpy": stream_numpy,
            "stream": stream_ours,
            "inmemory": inmemory,
        }
        for fn in arms.values():  # warm-up: executor start, imports
            fn()
        timings.clear()
        for _ in range(args.reps):
            for name, fn in arms.items():
                start = time.perf_counter()
                fn()
                timings.setdefault(name, []).append(time.perf_counter() - start)
    finally:
        ray.shutdown()
        shutil.rmtree(ray_tmp, ignore_errors=True)

    base = median(timings["ray"])
    rows = [[name, median(ts), args.rows / median(ts), base / median(ts)]
            for name, ts in timings.items()]
    print_table(f"one pass over {args.rows} rows x {args.features} float32, batch {bs}, "
                f"medians of {args.reps}", ["arm", "s", "rows/s", "speed vs ray"], rows)
    print(NOISE_NOTE)
    results = {"args": vars(args), "timings_s": timings,
               "median_s": {name: median(ts) for name, ts in timings.items()},
               "speed_vs_ray": {r[0]: r[3] for r in rows}, "note": NOISE_NOTE}
    write_results("ingest", results)
    return results


if __name__ == "__main__":
    main()
