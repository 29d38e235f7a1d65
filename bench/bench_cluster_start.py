"""Local cluster start: a RayTask(head 1 CPU + 1 worker node) task vs a bare ``ray.init``.

OUR arm: call ``@uniflow.task(config=RayTask(head_cpu=1, worker_cpu=1, worker_instances=1))``
(on its own, i.e. a run of one task with the silent reporter). The body records
``time.perf_counter()`` when it starts and again once ``ray.get`` of a trivial remote task
returned, and passes both out through its return value.
RAW arm: ``ray.init(address="local")``, the same trivial ``ray.get``, ``ray.shutdown()``.

Both arms are measured to "can run a Ray task" (the trivial ``ray.get`` returned), from the
call (ours) or from just before ``ray.init`` (raw). Arms alternate, 3 rounds by default.
Reported: the median ratio ours/bare (target at most 1.5x), body-start and teardown times, and
the Ray processes left behind: ``raylet`` processes whose command line contains ``uf-ray-``
(the plugin's session temp dirs) before and after, plus any process at all that still names
one of this benchmark's own temp dirs.

    .venv/bin/python bench/bench_cluster_start.py [--reps 3]
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

from _common import (  # noqa: E402
    NOISE_NOTE,
    alternate,
    median,
    print_table,
    temp_storage,
    write_results,
)

TARGET_RATIO = 1.5


def processes_naming(fragment: str, executable: str | None = None) -> list[int]:
    """PIDs whose command line contains ``fragment`` (and ``executable``, when given)."""
    pids = []
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                cmdline = handle.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if fragment in cmdline and (executable is None or executable in cmdline):
            pids.append(int(entry))
    return pids


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args(argv)

    warnings.filterwarnings("ignore")
    logging.getLogger("ray").setLevel(logging.WARNING)
    for var in ("RAY_ADDRESS", "UF_RAY_PROVISIONER"):  # always the local provisioner
        os.environ.pop(var, None)

    import ray

    import michelangelo.uniflow.core as uniflow
    from michelangelo.uniflow.plugins.ray import RayTask
    from michelangelo.uniflow.plugins.ray._capacity import _train_check

    @ray.remote
    def one() -> int:
        return 1

    @uniflow.task(config=RayTask(head_cpu=1, worker_cpu=1, worker_instances=1))
    def cluster_probe() -> dict:
        body_start = time.perf_counter()
        assert ray.get(one.remote()) == 1
        ready = time.perf_counter()
        cluster = _train_check._CLUSTER.get()
        return {
            "body_start": body_start,
            "ready": ready,
            "temp_dir": getattr(cluster, "temp_dir", None),
            "node_pids": list(getattr(cluster, "node_pids", [])),
        }

    raylets_before = processes_naming("uf-ray-", "raylet")
    own_dirs: list[str] = []
    details: dict[str, list[dict]] = {"ours": [], "bare": []}

    def ours() -> float:
        start = time.perf_counter()
        out = cluster_probe()
        end = time.perf_counter()
        own_dirs.append(out["temp_dir"])
        left = processes_naming(out["temp_dir"]) if out["temp_dir"] else []
        details["ours"].append({
            "to_body_s": out["body_start"] - start,
            "to_ready_s": out["ready"] - start,
            "teardown_s": end - out["ready"],
            "total_s": end - start,
            "processes_left": len(left),
        })
        return out["ready"] - start

    def bare() -> float:
        temp_dir = tempfile.mkdtemp(prefix="ufb-bare-", dir="/tmp")
        own_dirs.append(temp_dir)
        start = time.perf_counter()
        ray.init(address="local", _temp_dir=temp_dir)
        init_done = time.perf_counter()
        assert ray.get(one.remote()) == 1
        ready = time.perf_counter()
        ray.shutdown()
        end = time.perf_counter()
        left = processes_naming(temp_dir)
        details["bare"].append({
            "to_init_s": init_done - start,
            "to_ready_s": ready - start,
            "teardown_s": end - ready,
            "total_s": end - start,
            "processes_left": len(left),
        })
        shutil.rmtree(temp_dir, ignore_errors=True)
        return ready - start

    with temp_storage("cluster"):
        runs = alternate({"ours": ours, "bare": bare}, args.reps)

    time.sleep(2.0)  # let exiting processes be reaped before the final census
    raylets_after = processes_naming("uf-ray-", "raylet")
    leftovers = sorted({pid for d in own_dirs if d for pid in processes_naming(d)})
    left_dirs = [d for d in own_dirs if d and os.path.exists(d)]
    for d in left_dirs:  # e.g. a late metrics file an exiting Ray process wrote after rmtree
        if os.path.basename(d).startswith("ufb-bare-"):
            shutil.rmtree(d, ignore_errors=True)

    ratios = [o / b for o, b in zip(runs["ours"], runs["bare"], strict=True)]
    ratio = median(ratios)
    rows = []
    for i in range(args.reps):
        o, b = details["ours"][i], details["bare"][i]
        rows.append([i + 1, o["to_body_s"], o["to_ready_s"], b["to_ready_s"], ratios[i],
                     o["teardown_s"], b["teardown_s"]])
    print_table(
        "cluster start: RayTask(head 1 CPU + 1 x worker 1 CPU) vs bare ray.init (alternated), "
        "seconds",
        ["rep", "ours: to body", "ours: to ray.get", "bare: to ray.get", "ours/bare",
         "ours teardown", "bare teardown"],
        rows,
    )
    verdict = "within" if ratio <= TARGET_RATIO else "OVER"
    print(f"\nmedian ratio ours/bare (to first ray.get): {ratio:.2f}x  (target <= {TARGET_RATIO}x: "
          f"{verdict}); ratio of median times: {median(runs['ours']) / median(runs['bare']):.2f}x")
    print(f"median ours to body start: {median([d['to_body_s'] for d in details['ours']]):.2f} s")
    print(f"raylets with 'uf-ray-' in cmdline: before {len(raylets_before)}, after "
          f"{len(raylets_after)} (machine-wide: other jobs' clusters count too)")
    print(f"processes still naming this benchmark's temp dirs: {len(leftovers)}; temp dirs found "
          f"left after the run: {left_dirs or 'none'} (the bare arm's are removed again)")
    print(NOISE_NOTE)

    results = {
        "repetitions": args.reps,
        "ours_to_ready_s": runs["ours"],
        "bare_to_ready_s": runs["bare"],
        "ratio_ours_over_bare": ratios,
        "median_ratio": ratio,
        "ratio_of_median_times": median(runs["ours"]) / median(runs["bare"]),
        "target_ratio": TARGET_RATIO,
        "within_target": ratio <= TARGET_RATIO,
        "details": details,
        "raylets_uf_ray_before": raylets_before,
        "raylets_uf_ray_after": raylets_after,
        "leftover_pids_own_temp_dirs": leftovers,
        "leftover_temp_dirs": left_dirs,
        "note": NOISE_NOTE,
    }
    write_results("cluster_start", results)
    return results


if __name__ == "__main__":
    main()
