"""Shared helpers of the foundation benchmarks: temp storage, alternation, tables, JSON.

Every benchmark runs OUR implementation and the raw equivalent side by side in one process,
alternating them (A B A B ...), and reports medians. Nothing here asserts a time.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
RESULTS_DIR = os.path.join(BENCH_DIR, "results")

if BENCH_DIR not in sys.path:  # `python bench/x.py` and `python -m bench.x` both work
    sys.path.insert(0, BENCH_DIR)


@contextlib.contextmanager
def temp_storage(prefix: str) -> Iterator[str]:
    """A fresh ``UF_STORAGE_URL`` for the benchmark, removed (with its env var) at the end."""
    root = tempfile.mkdtemp(prefix=f"ufbench-{prefix}-")
    previous = os.environ.get("UF_STORAGE_URL")
    os.environ["UF_STORAGE_URL"] = root
    try:
        yield root
    finally:
        if previous is None:
            os.environ.pop("UF_STORAGE_URL", None)
        else:
            os.environ["UF_STORAGE_URL"] = previous
        shutil.rmtree(root, ignore_errors=True)


def alternate(arms: dict[str, Callable[[], Any]], repetitions: int,
              on_result: Callable[[str, int, Any], None] | None = None) -> dict[str, list[Any]]:
    """Run the arms in turn, ``repetitions`` rounds of A B (...); collect each arm's results."""
    out: dict[str, list[Any]] = {name: [] for name in arms}
    for rep in range(repetitions):
        for name, fn in arms.items():
            value = fn()
            out[name].append(value)
            if on_result is not None:
                on_result(name, rep, value)
    return out


def timed(fn: Callable[[], Any]) -> Callable[[], float]:
    """``fn`` turned into a function returning its wall time in seconds."""

    def run() -> float:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    return run


def median(values: list[float]) -> float:
    return statistics.median(values)


def load_average() -> list[float] | None:
    try:
        return list(os.getloadavg())
    except OSError:
        return None


def environment() -> dict[str, Any]:
    env = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "load_average": load_average(),
        "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    with contextlib.suppress(Exception):
        import ray

        env["ray"] = ray.__version__
    return env


def print_table(title: str, header: list[str], rows: list[list[Any]]) -> None:
    """A small fixed-width table on stdout."""
    cells = [[_fmt(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h)
              for i, h in enumerate(header)]
    print(f"\n{title}")
    print("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for row in cells:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


def write_results(name: str, results: dict[str, Any]) -> str:
    """Write ``bench/results/<name>.json`` (the folder is git-ignored) and return its path."""
    os.makedirs(RESULTS_DIR, exist_ok=True)
    path = os.path.join(RESULTS_DIR, f"{name}.json")
    payload = {"benchmark": name, "environment": environment(), **results}
    with open(path, "w") as handle:
        json.dump(payload, handle, indent=2, default=str)
    print(f"\nresults written to {os.path.relpath(path)}")
    return path


NOISE_NOTE = (
    "Times are wall-clock on a shared machine; with other jobs running they are noisy. "
    "Compare the two arms of one run (alternated, medians), not runs with each other."
)
