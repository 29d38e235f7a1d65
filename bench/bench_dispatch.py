"""Per-task overhead of uniflow dispatch: a workflow of 100 no-op tasks vs 100 plain calls.

OUR arm: ``uniflow.Context(reporter=Reporter()).run(chain, 100)``, where ``chain`` calls a
``@uniflow.task()`` 100 times; each call returns a small JSON-able value, so each result is
persisted (record, output folder, log file) under a temporary ``UF_STORAGE_URL``.
RAW arm: the same 100 calls of the undecorated function.

Reported: median over alternated repetitions of (workflow time - baseline time) / 100, in ms,
against the target of at most 5 ms per task. A cProfile of one extra workflow run is saved in
the JSON results (and printed when the overhead is over target, or with ``--profile``).

    .venv/bin/python bench/bench_dispatch.py [--tasks 100] [--reps 5] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import (  # noqa: E402
    NOISE_NOTE,
    alternate,
    median,
    print_table,
    temp_storage,
    write_results,
)

import michelangelo.uniflow.core as uniflow  # noqa: E402
from michelangelo.uniflow.core import Reporter  # noqa: E402

TARGET_MS = 5.0


@uniflow.task()
def step(i: int) -> int:
    return i + 1


@uniflow.workflow()
def chain(n: int) -> int:
    value = 0
    for _ in range(n):
        value = step(value)
    return value


def plain_chain(n: int) -> int:
    value = 0
    fn = step.fn
    for _ in range(n):
        value = fn(value)
    return value


def profile_once(n: int, top: int = 15) -> dict:
    """cProfile one workflow run; the top functions by own time and by cumulative time."""
    profiler = cProfile.Profile()
    context = uniflow.Context(reporter=Reporter())
    profiler.enable()
    context.run(chain, n)
    profiler.disable()
    stats = pstats.Stats(profiler)
    total = stats.total_tt

    def rows(sort: str) -> list[dict]:
        stats.sort_stats(sort)
        out = []
        for func in stats.fcn_list[:top]:  # type: ignore[attr-defined]
            cc, nc, tt, ct, _ = stats.stats[func]  # type: ignore[attr-defined]
            filename, line, name = func
            out.append({
                "function": f"{_short(filename)}:{line}({name})",
                "calls": nc,
                "tottime_ms_per_task": 1000 * tt / n,
                "cumtime_ms_per_task": 1000 * ct / n,
            })
        return out

    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(40)
    return {
        "profiled_total_ms_per_task": 1000 * total / n,
        "by_tottime": rows("tottime"),
        "by_cumtime": rows("cumulative"),
        "text": text.getvalue(),
    }


def _short(filename: str) -> str:
    for marker in ("site-packages/", "michelangelo/", "lib/python3"):
        if marker in filename:
            return filename[filename.index(marker):]
    return filename


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=100)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--profile", action="store_true", help="always print the profile")
    args = parser.parse_args(argv)
    n = args.tasks

    with temp_storage("dispatch") as root:
        context = uniflow.Context(reporter=Reporter())  # storage from $UF_STORAGE_URL

        cpu: dict[str, list[float]] = {"uniflow": [], "plain": []}

        def ours() -> float:
            cpu0, start = time.process_time(), time.perf_counter()
            result = context.run(chain, n)
            took = time.perf_counter() - start
            cpu["uniflow"].append(time.process_time() - cpu0)
            assert result == n
            return took

        def raw() -> float:
            cpu0, start = time.process_time(), time.perf_counter()
            result = plain_chain(n)
            took = time.perf_counter() - start
            cpu["plain"].append(time.process_time() - cpu0)
            assert result == n
            return took

        ours()  # warm-up (imports, code fingerprint, filesystem caches); not reported
        cpu["uniflow"].clear()
        runs = alternate({"uniflow": ours, "plain": raw}, args.reps)
        run_dir = os.path.join(root, "runs", context.last_run_id or "")
        files_per_run = sum(len(files) for _, _, files in os.walk(run_dir))
        profile = profile_once(n)

    overheads_ms = [1000 * (o - r) / n for o, r in zip(runs["uniflow"], runs["plain"], strict=True)]
    per_task_ms = median(overheads_ms)
    cpu_overheads_ms = [1000 * (o - r) / n for o, r in zip(cpu["uniflow"], cpu["plain"], strict=True)]
    rows = [
        [i + 1, 1000 * o, 1000 * r, d, c]
        for i, (o, r, d, c) in enumerate(
            zip(runs["uniflow"], runs["plain"], overheads_ms, cpu_overheads_ms, strict=True))
    ]
    print_table(
        f"dispatch: workflow of {n} no-op tasks vs {n} plain calls (alternated)",
        ["rep", "uniflow ms", "plain ms", "overhead ms/task", "CPU overhead ms/task"],
        rows,
    )
    verdict = "within" if per_task_ms <= TARGET_MS else "OVER"
    print(f"\nmedian overhead per task: {per_task_ms:.3f} ms  (target <= {TARGET_MS} ms: {verdict})")
    print(f"median CPU-time overhead per task: {median(cpu_overheads_ms):.3f} ms "
          "(this process's CPU time; less sensitive to machine load than wall time)")
    print(f"files written per run: {files_per_run} ({files_per_run / n:.1f} per task)")
    print(f"profiled run: {profile['profiled_total_ms_per_task']:.3f} ms/task under cProfile")
    if per_task_ms > TARGET_MS or args.profile:
        print("\ntop costs by own time (ms per task):")
        for row in profile["by_tottime"][:12]:
            print(f"  {row['tottime_ms_per_task']:8.3f}  {row['calls']:6d}  {row['function']}")
        print("\ntop costs by cumulative time (ms per task):")
        for row in profile["by_cumtime"][:15]:
            print(f"  {row['cumtime_ms_per_task']:8.3f}  {row['calls']:6d}  {row['function']}")
    print(NOISE_NOTE)

    results = {
        "tasks": n,
        "repetitions": args.reps,
        "uniflow_s": runs["uniflow"],
        "plain_s": runs["plain"],
        "overhead_ms_per_task": overheads_ms,
        "median_overhead_ms_per_task": per_task_ms,
        "uniflow_cpu_s": cpu["uniflow"],
        "plain_cpu_s": cpu["plain"],
        "cpu_overhead_ms_per_task": cpu_overheads_ms,
        "median_cpu_overhead_ms_per_task": median(cpu_overheads_ms),
        "target_ms_per_task": TARGET_MS,
        "within_target": per_task_ms <= TARGET_MS,
        "files_written_per_run": files_per_run,
        "profile": profile,
        "note": NOISE_NOTE,
    }
    write_results("dispatch", results)
    return results


if __name__ == "__main__":
    main()
