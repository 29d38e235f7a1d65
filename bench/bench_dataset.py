"""DatasetVariable round trip vs raw Ray Data Parquet, 1M rows x 10 float columns.

OUR arm: ``DatasetIO().write(DatasetVariable.create(ds), Storage(url), folder)`` (Parquet via
Ray, plus the schema / row count / fingerprint description), ``DatasetIO().read(...)`` (the
handle), ``handle.load_ray_dataset()`` and the consumption.
RAW arm: ``ds.write_parquet(path)``, ``ray.data.read_parquet(path)`` and the same consumption.
Consumption in both arms: ``.to_pandas()`` (every value read), checked for the row count.

The source dataset is built once in the driver and materialised, so both arms write the same
blocks. Reported: median throughput ratio raw_time / our_time (target >= 0.9), a phase
breakdown of our arm (the fingerprint hashing in ``_describe`` is timed separately) and the
handle's pickled size.

    .venv/bin/python bench/bench_dataset.py [--rows 1000000] [--cols 10] [--reps 5]
"""

from __future__ import annotations

import argparse
import logging
import os
import pickle
import shutil
import sys
import tempfile
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import (  # noqa: E402
    NOISE_NOTE,
    alternate,
    median,
    print_table,
    temp_storage,
    write_results,
)

TARGET_RATIO = 0.9


def build_dataset(rows: int, cols: int, blocks: int):
    import numpy as np
    import pandas as pd
    import ray.data

    rng = np.random.default_rng(0)
    frame = pd.DataFrame(
        rng.standard_normal((rows, cols)), columns=[f"f{i}" for i in range(cols)]
    )
    step = -(-rows // blocks)
    parts = [frame.iloc[i:i + step].reset_index(drop=True) for i in range(0, rows, step)]
    return ray.data.from_pandas(parts).materialize(), frame.memory_usage(index=False).sum()


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--cols", type=int, default=10)
    parser.add_argument("--blocks", type=int, default=8, help="blocks of the source dataset")
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args(argv)

    warnings.filterwarnings("ignore")
    for name in ("ray", "ray.data"):
        logging.getLogger(name).setLevel(logging.WARNING)
    os.environ.pop("RAY_ADDRESS", None)
    import ray
    import ray.data

    from michelangelo.uniflow.core.plugin import Storage
    from michelangelo.workflow.variables import DatasetVariable, _dataset_io
    from michelangelo.workflow.variables._dataset_io import DatasetIO

    ray_tmp = tempfile.mkdtemp(prefix="ufb-ray-", dir="/tmp")
    ray.init(address="local", num_cpus=2, include_dashboard=False,
             object_store_memory=1 * 2**30, logging_level="ERROR", log_to_driver=False,
             _temp_dir=ray_tmp)
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False

    # Time the content description (_describe: file hashing + footers) inside our arm without
    # changing it: a wrapper around the module function DatasetIO.write calls.
    describe_times: list[float] = []
    original_describe = _dataset_io._describe

    def timed_describe(storage, target):
        start = time.perf_counter()
        try:
            return original_describe(storage, target)
        finally:
            describe_times.append(time.perf_counter() - start)

    _dataset_io._describe = timed_describe
    try:
        with temp_storage("dataset") as root:
            ds, nbytes = build_dataset(args.rows, args.cols, args.blocks)
            url = root  # a plain local path, as UF_STORAGE_URL is
            io = DatasetIO()
            phases: dict[str, list[float]] = {
                "ours_write": [], "ours_describe": [], "ours_read_handle": [],
                "ours_load_consume": [], "raw_write": [], "raw_read_consume": [],
            }
            sizes: dict[str, int] = {}
            counter = {"n": 0}

            def ours() -> float:
                counter["n"] += 1
                storage = Storage(url)
                folder = storage.join("bench", f"ours-{counter['n']}")
                start = time.perf_counter()
                meta = io.write(DatasetVariable.create(ds), storage, folder)
                t_write = time.perf_counter()
                handle = io.read(storage, folder, meta)
                t_read = time.perf_counter()
                frame = handle.load_ray_dataset().to_pandas()
                end = time.perf_counter()
                assert len(frame) == args.rows, len(frame)
                phases["ours_write"].append(t_write - start)
                phases["ours_describe"].append(describe_times[-1])
                phases["ours_read_handle"].append(t_read - t_write)
                phases["ours_load_consume"].append(end - t_read)
                if not sizes:
                    fresh = io.read(storage, folder, meta)
                    sizes["handle_pickled_bytes"] = len(pickle.dumps(fresh))
                    sizes["loaded_handle_pickled_bytes"] = len(pickle.dumps(handle))
                    sizes["parquet_bytes"] = _folder_bytes(os.path.join(folder, "data"))
                    sizes["parquet_files"] = len(os.listdir(os.path.join(folder, "data")))
                shutil.rmtree(folder, ignore_errors=True)
                return end - start

            def raw() -> float:
                counter["n"] += 1
                path = os.path.join(root, "bench", f"raw-{counter['n']}")
                start = time.perf_counter()
                ds.write_parquet(path)
                t_write = time.perf_counter()
                frame = ray.data.read_parquet(path).to_pandas()
                end = time.perf_counter()
                assert len(frame) == args.rows, len(frame)
                phases["raw_write"].append(t_write - start)
                phases["raw_read_consume"].append(end - t_write)
                shutil.rmtree(path, ignore_errors=True)
                return end - start

            # Warm-up on a tiny dataset (Ray workers, Parquet writer and reader code paths),
            # cheaper than a full round trip; not reported.
            warm = os.path.join(root, "bench", "warm-up")
            ray.data.range(1000).write_parquet(warm)
            ray.data.read_parquet(warm).to_pandas()
            shutil.rmtree(warm, ignore_errors=True)
            runs = alternate({"ours": ours, "raw": raw}, args.reps)
    finally:
        _dataset_io._describe = original_describe
        ray.shutdown()
        shutil.rmtree(ray_tmp, ignore_errors=True)

    ratios = [r / o for o, r in zip(runs["ours"], runs["raw"], strict=True)]
    ratio = median(ratios)
    mb = nbytes / 2**20
    rows = [
        [i + 1, o, r, rt, phases["ours_describe"][i]]
        for i, (o, r, rt) in enumerate(zip(runs["ours"], runs["raw"], ratios, strict=True))
    ]
    print_table(
        f"dataset round trip: {args.rows} rows x {args.cols} float64 cols ({mb:.0f} MiB), "
        "alternated",
        ["rep", "ours s", "raw s", "raw/ours", "of which _describe s"],
        rows,
    )
    med = {k: median(v) for k, v in phases.items()}
    print_table(
        "median phases (s)",
        ["phase", "ours", "raw"],
        [
            ["write Parquet (ours: incl. _describe)", med["ours_write"], med["raw_write"]],
            ["  _describe (hash + footers)", med["ours_describe"], "-"],
            ["read -> handle", med["ours_read_handle"], "-"],
            ["load + to_pandas", med["ours_load_consume"], med["raw_read_consume"]],
        ],
    )
    verdict = "within" if ratio >= TARGET_RATIO else "UNDER"
    print(f"\nmedian throughput ratio raw/ours: {ratio:.3f}  (target >= {TARGET_RATIO}: {verdict}); "
          f"ratio of median times: {median(runs['raw']) / median(runs['ours']):.3f}")
    print(f"ours: {mb / median(runs['ours']):.0f} MiB/s, raw: {mb / median(runs['raw']):.0f} MiB/s "
          "(round trip)")
    print(f"_describe: {med['ours_describe']:.3f} s median "
          f"({sizes['parquet_bytes'] / 2**20 / max(med['ours_describe'], 1e-9):.0f} MiB/s over "
          f"{sizes['parquet_files']} Parquet file(s)); ratio without it would be "
          f"{median([r / (o - d) for o, r, d in zip(runs['ours'], runs['raw'], phases['ours_describe'], strict=True)]):.3f}")
    print(f"handle pickled size: {sizes['handle_pickled_bytes']} bytes "
          f"(after load_ray_dataset: {sizes['loaded_handle_pickled_bytes']} bytes)")
    print(NOISE_NOTE)

    results = {
        "rows": args.rows,
        "cols": args.cols,
        "source_blocks": args.blocks,
        "in_memory_mib": mb,
        "repetitions": args.reps,
        "ours_s": runs["ours"],
        "raw_s": runs["raw"],
        "ratio_raw_over_ours": ratios,
        "median_ratio": ratio,
        "ratio_of_median_times": median(runs["raw"]) / median(runs["ours"]),
        "target_ratio": TARGET_RATIO,
        "within_target": ratio >= TARGET_RATIO,
        "phases_s": phases,
        "median_phases_s": med,
        **sizes,
        "consumption": "to_pandas()",
        "note": NOISE_NOTE,
    }
    write_results("dataset", results)
    return results


def _folder_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


if __name__ == "__main__":
    main()
