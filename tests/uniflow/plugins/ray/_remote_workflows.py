"""Workflows the remote-run tests run as scripts: `python _remote_workflows.py remote-run ...`.

The workflow's arguments come from the environment (the command line belongs to uniflow).
"""

from __future__ import annotations

import os
import time

import ray

import michelangelo.uniflow.core as uniflow
from michelangelo.uniflow.plugins.ray import RayTask

SMALL = RayTask(head_cpu=1, worker_cpu=1, worker_instances=1)


def _where() -> dict:
    return {"pid": os.getpid(), "node": ray.get_runtime_context().get_node_id(),
            "cwd": os.getcwd()}


@uniflow.task(config=SMALL, retries=1)
def flaky(marker: str) -> dict:
    """Fails on its first attempt (it leaves a marker), succeeds on the second."""
    if not os.path.exists(marker):
        open(marker, "w").close()
        raise RuntimeError("flaky: first attempt fails on purpose")
    return {"value": ray.get(ray.remote(lambda: 41).remote()) + 1, **_where()}


@uniflow.task(config=SMALL, cache=True)
def cached(x: int) -> dict:
    print(f"cached body runs for x={x}")
    return {"x": x, **_where()}


class FlagMissing(ValueError):
    """A user exception type defined in the workflow file."""


@uniflow.task(config=SMALL)
def fragile(flag: str) -> str:
    print(f"fragile looks for {flag}")
    if not os.path.exists(flag):
        raise FlagMissing(f"flag file {flag} is missing")
    return "fragile ok"


@uniflow.task(config=SMALL)
def meet(x: int, folder: str, branches: int) -> dict:
    """Says it started, then waits for every branch of its batch to start too (or gives up).

    Run one after another, the first branch can never see the others start, so its answer
    shows whether the jobs really overlapped, without reading any clock.
    """
    print(f"meet body runs for x={x}", flush=True)
    open(os.path.join(folder, f"started-{x}"), "w").close()
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        seen = sorted(n for n in os.listdir(folder) if n.startswith("started-"))
        if len(seen) >= branches:
            break
        time.sleep(0.2)
    return {"x": x, "seen": len(seen), "inmemory": os.environ.get("MA_TRAINER_INMEMORY"),
            **_where()}


@uniflow.task(config=SMALL)
def sleeper(seconds: float) -> str:
    print("sleeper started", flush=True)
    time.sleep(seconds)
    return "slept"


@uniflow.task(config=RayTask(head_cpu=1, worker_cpu=64, worker_instances=1))
def huge() -> str:
    return "never runs: no node of the test cluster has 64 CPUs"


@uniflow.workflow()
def too_big() -> str:
    return huge()


@uniflow.workflow()
def features(marker: str, flag: str) -> dict:
    first = flaky(marker)
    second = cached(7)
    third = cached(7)  # same code and inputs: served from the cache the call above filled
    return {"flaky": first, "cached": [second, third], "fragile": fragile(flag)}


@uniflow.workflow()
def slow(seconds: float) -> str:
    return sleeper(seconds)


@uniflow.workflow()
def batch_of_jobs(folder: str) -> list:
    from michelangelo.uniflow.core.lib import concurrent

    return concurrent.batch_run([concurrent.new_callable(meet, x, folder, 2)
                                 for x in (1, 2)]).get()


@uniflow.workflow()
def slow_batch(seconds: float) -> list:
    from michelangelo.uniflow.core.lib import concurrent

    return concurrent.batch_run([concurrent.new_callable(sleeper, seconds)
                                 for _ in range(2)]).get()


# --kuberay: a RayCluster per branch. Head-only clusters keep the test bed's nodes light.
ONE_CPU = RayTask(head_cpu=1, head_memory="1Gi", worker_instances=0)
THREE_CPU = RayTask(head_cpu=3, head_memory="1Gi", worker_instances=0)  # one at a time


def _stamp(folder: str, name: str, moment: str) -> None:
    with open(os.path.join(folder, f"{name}.{moment}"), "w") as handle:
        handle.write(repr(time.time()))


@uniflow.task(config=ONE_CPU)
def stamp(x: int, folder: str, branches: int) -> dict:
    """Records when it starts and ends; waits (bounded) for the batch's others to start."""
    _stamp(folder, f"stamp-{x}", "start")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if len([n for n in os.listdir(folder) if n.endswith(".start")]) >= branches:
            break
        time.sleep(0.2)
    _stamp(folder, f"stamp-{x}", "end")
    return {"x": x, **_where()}


@uniflow.task(config=THREE_CPU)
def hog(x: int, folder: str, flag: str) -> dict:
    """Needs 3 CPU: the test bed's nodes (4 and 2 CPU) hold one such cluster at a time.

    The second one fails (after recording its times) while ``flag`` is missing.
    """
    _stamp(folder, f"hog-{x}", "start")
    time.sleep(2)
    _stamp(folder, f"hog-{x}", "end")
    if x == 2 and not os.path.exists(flag):
        raise FlagMissing(f"flag file {flag} is missing")
    return {"x": x, **_where()}


@uniflow.workflow()
def kuberay_fanout(folder: str, flag: str) -> dict:
    from michelangelo.uniflow.core.lib import concurrent

    pair = concurrent.batch_run([concurrent.new_callable(stamp, x, folder, 2)
                                 for x in (1, 2)]).get()
    try:
        concurrent.run(huge).result()  # 64 CPU: fails before any cluster starts
        never = "ran"
    except Exception as exc:  # its own error, with the task name and branch in front
        never = f"{type(exc).__name__}: {exc}"
    hogs = [concurrent.run(hog, x, folder, flag) for x in (1, 2)]  # not planned: one waits
    return {"pair": pair, "never": never, "hogs": [h.result() for h in hogs]}


@uniflow.task(config=ONE_CPU)
def nap(seconds: float) -> str:
    print("nap started", flush=True)
    time.sleep(seconds)
    return "slept"


@uniflow.workflow()
def slow_pair(seconds: float) -> list:
    from michelangelo.uniflow.core.lib import concurrent

    return concurrent.batch_run([concurrent.new_callable(nap, seconds)
                                 for _ in range(2)]).get()


if __name__ == "__main__":
    context = uniflow.create_context()
    if os.environ.get("WF") == "slow":
        result = context.run(slow, float(os.environ["WF_SECONDS"]))
    elif os.environ.get("WF") == "slow_batch":
        result = context.run(slow_batch, float(os.environ["WF_SECONDS"]))
    elif os.environ.get("WF") == "batch":
        result = context.run(batch_of_jobs, os.environ["WF_MEET"])
    elif os.environ.get("WF") == "slow_pair":
        result = context.run(slow_pair, float(os.environ["WF_SECONDS"]))
    elif os.environ.get("WF") == "kuberay_fanout":
        result = context.run(kuberay_fanout, os.environ["WF_FOLDER"], os.environ["WF_FLAG"])
    elif os.environ.get("WF") == "huge":
        result = context.run(too_big)
    else:
        result = context.run(features, os.environ["WF_MARKER"], os.environ["WF_FLAG"])
    print(f"run id: {context.last_run_id}")
    print(f"result: {result!r}")
