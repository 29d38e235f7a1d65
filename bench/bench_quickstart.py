"""The whole quickstart through the SDK against the same job written with Ray alone.

- ``sdk``: ``python examples/quickstart/workflow.py`` (what ``make demo`` runs once set up):
  prepare on a local Ray cluster, train with ``LightningTrainer``, register, deploy, score.
- ``ray``: ``bench/handwritten_quickstart.py``: Ray Data, a 2-worker ``TorchTrainer`` with
  ``ray.train.lightning``, Ray Serve and requests over HTTP; same rows, model, batch size,
  epochs and workers.

Each run is a fresh Python process (imports, Ray start and shutdown included), the arms
alternate (sdk ray sdk ray ...) after one warm-up round of each that is not counted, and the
table reports medians and the ratio sdk / ray. Nothing here asserts a time.

Around each run ``_cpu.CpuMeter`` also counts the CPU-seconds the whole machine was busy and
which kinds of process spent them, so a gap between the arms shows up as work done or as cores
left idle.

    python bench/bench_quickstart.py --reps 3
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

from _common import NOISE_NOTE, alternate, load_average, median, print_table, write_results
from _cpu import CpuMeter, print_cpu

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PORT = 8000  # the quickstart's own default port; both arms serve on it, one at a time


def _port_free(port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _run(arm: str, command: list[str], env: dict[str, str]) -> dict:
    deadline = time.monotonic() + 60
    while not _port_free(PORT):
        if time.monotonic() > deadline:
            raise SystemExit(f"port {PORT} stays busy: stop what serves on it and run again")
        time.sleep(1)
    start = time.perf_counter()
    with CpuMeter() as meter:
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=1800, check=False)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        sys.stderr.write(done.stdout[-4000:] + done.stderr[-4000:])
        raise SystemExit(f"{arm}: exited {done.returncode}")
    return {"wall_s": wall, "load_average": load_average(), "stdout_tail": done.stdout[-2000:],
            "cpu": meter.result()}


def _last_run(storage: str) -> dict | None:
    """The newest run in ``storage``: its id and ``runs show`` (tasks and their phases)."""
    cli = os.path.join(os.path.dirname(sys.executable), "michelangelo")
    env = {**os.environ, "UF_STORAGE_URL": storage}
    listing = subprocess.run([cli, "runs", "list", "--limit", "1"], env=env,
                             capture_output=True, text=True, check=False).stdout.splitlines()
    if len(listing) < 2:
        return None
    run_id = listing[1].split()[0]
    shown = subprocess.run([cli, "runs", "show", run_id], env=env, capture_output=True,
                           text=True, check=False).stdout
    return {"run": run_id, "show": shown}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3, help="counted rounds of each arm")
    parser.add_argument("--no-warmup", action="store_true",
                        help="count the first round too (both arms pay cold disk caches)")
    args = parser.parse_args(argv)

    storage = tempfile.mkdtemp(prefix="ufbench-quickstart-")
    env = {**os.environ, "UF_STORAGE_URL": storage}
    env.pop("RAY_ADDRESS", None)
    python = sys.executable
    arms = {
        "sdk": lambda: _run("sdk", [python, "examples/quickstart/workflow.py"], env),
        "ray": lambda: _run("ray", [python, "bench/handwritten_quickstart.py",
                                    "--port", str(PORT)], env),
    }

    def show(name: str, rep: int, value: dict) -> None:
        print(f"  round {rep}: {name} {value['wall_s']:.1f} s (load {value['load_average']})",
              flush=True)

    if not args.no_warmup:
        print("warm-up round (not counted):", flush=True)
        alternate(arms, 1, on_result=show)
    print(f"{args.reps} counted rounds:", flush=True)
    runs = alternate(arms, args.reps, on_result=show)

    sdk = median([r["wall_s"] for r in runs["sdk"]])
    raw = median([r["wall_s"] for r in runs["ray"]])
    hand_phases = [json.loads(r["stdout_tail"].strip().splitlines()[-1])["phases_s"]
                   for r in runs["ray"]]
    print_table("whole quickstart, fresh processes, medians", ["arm", "wall s", "rounds"],
                [["sdk (examples/quickstart/workflow.py)", sdk, len(runs["sdk"])],
                 ["ray (bench/handwritten_quickstart.py)", raw, len(runs["ray"])]])
    print(f"\nsdk / ray: {sdk / raw:.3f}  (target at most 0.8)")
    print_cpu(runs)
    print("hand-written phases (last round):", hand_phases[-1])
    last = _last_run(storage)
    if last is not None:
        print("\nthe SDK's last run:\n" + last["show"])
    print(NOISE_NOTE)
    results = {"sdk_s": [r["wall_s"] for r in runs["sdk"]],
               "ray_s": [r["wall_s"] for r in runs["ray"]],
               "sdk_median_s": sdk, "ray_median_s": raw, "ratio": sdk / raw,
               "hand_written_phases_s": hand_phases, "sdk_last_run": last,
               "cpu": {arm: [r["cpu"] for r in rows] for arm, rows in runs.items()}}
    write_results("bench_quickstart", results)
    return results


if __name__ == "__main__":
    main()
