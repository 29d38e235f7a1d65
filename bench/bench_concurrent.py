"""Eight RayTask branches: ``concurrent.batch_run`` vs calling them in turn vs bare ``ray.remote``.

One workflow run on one local cluster with room for four at once (``RayTask(head_cpu=4)``).
Each branch is a ``RayTask`` task whose body does ``ray.get`` of one Ray task (1 CPU) that
sleeps ``--work-s`` seconds (1 s by default; 0 measures the bare overheads) and returns.

- BATCH: ``concurrent.batch_run`` of the eight calls, ``.get()``.
- SEQUENTIAL: the same eight task calls, one after another.
- BARE: inside one RayTask body on the same cluster, eight ``ray.remote`` tasks doing the same
  work, submitted together and ``ray.get`` at once (what a hand-written Ray program does).

The cluster starts once, before the first round (a warm-up call); arms alternate, ``--reps``
rounds (3 by default). Reported: medians and the ratios BATCH/SEQUENTIAL (target at most 0.35)
and BATCH/BARE (target at most 1.2x).

    .venv/bin/python bench/bench_concurrent.py [--reps 3] [--work-s 1.0]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import NOISE_NOTE, median, print_table, temp_storage, write_results  # noqa: E402

BRANCHES = 8
TARGET_SEQUENTIAL = 0.35
TARGET_BARE = 1.2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--work-s", type=float, default=1.0)
    args = parser.parse_args()

    import ray

    import michelangelo.uniflow.core as uniflow
    from michelangelo.uniflow.core import Reporter
    from michelangelo.uniflow.core.lib import concurrent
    from michelangelo.uniflow.plugins.ray import RayTask

    shape = RayTask(head_cpu=4, head_memory="2Gi")

    @ray.remote(num_cpus=1)
    def work(seconds: float) -> int:
        time.sleep(seconds)
        return 1

    @uniflow.task(config=shape)
    def branch(seconds: float, index: int) -> int:
        return ray.get(work.remote(seconds))

    @uniflow.task(config=shape)
    def bare(seconds: float, round_: int) -> float:
        start = time.perf_counter()
        assert sum(ray.get([work.remote(seconds) for _ in range(BRANCHES)])) == BRANCHES
        return time.perf_counter() - start

    @uniflow.workflow()
    def bench(reps: int, seconds: float) -> dict:
        branch(0.0, -1)  # warm-up: starts the cluster
        times: dict[str, list[float]] = {"batch": [], "sequential": [], "bare": []}
        for rep in range(reps):
            start = time.perf_counter()
            batch = concurrent.batch_run([concurrent.new_callable(branch, seconds, 100 * rep + i)
                                          for i in range(BRANCHES)])
            assert sum(batch.get()) == BRANCHES
            times["batch"].append(time.perf_counter() - start)

            start = time.perf_counter()
            assert sum(branch(seconds, 1000 + 100 * rep + i) for i in range(BRANCHES)) == BRANCHES
            times["sequential"].append(time.perf_counter() - start)

            times["bare"].append(bare(seconds, rep))
            print(f"round {rep}: " + ", ".join(f"{k} {v[-1]:.3f}s" for k, v in times.items()),
                  flush=True)
        return times

    class Placement(Reporter):
        """Silent, except for each batch's placement line."""

        def info(self, message: str) -> None:
            if message.startswith("batch "):
                print(message, flush=True)

    with temp_storage("concurrent"):
        context = uniflow.Context(reporter=Placement())
        times = context.run(bench, args.reps, args.work_s)
    medians = {name: median(values) for name, values in times.items()}
    ratio_sequential = medians["batch"] / medians["sequential"]
    ratio_bare = medians["batch"] / medians["bare"]
    print_table(
        f"{BRANCHES} RayTask branches, {args.work_s:g} s of work each, cluster of 4 CPU "
        f"(median of {args.reps})",
        ["arm", "median s", "per round"],
        [[name, medians[name], " ".join(f"{v:.3f}" for v in times[name])] for name in times],
    )
    print(f"\nbatch / sequential: {ratio_sequential:.3f} (target at most {TARGET_SEQUENTIAL})")
    print(f"batch / bare ray.remote: {ratio_bare:.3f}x (target at most {TARGET_BARE}x)")
    print(NOISE_NOTE)
    write_results("concurrent", {
        "work_s": args.work_s, "reps": args.reps, "times": times, "medians": medians,
        "batch_over_sequential": ratio_sequential, "batch_over_bare": ratio_bare,
        "targets": {"batch_over_sequential": TARGET_SEQUENTIAL, "batch_over_bare": TARGET_BARE},
    })


if __name__ == "__main__":
    main()
