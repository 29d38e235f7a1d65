"""RayTask bodies as concurrent branches on the run's one local Ray cluster (real Ray).

Overlap and waiting are shown from timestamps the Ray tasks and Train workers record, with
barrier files that make the order deterministic.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import ray
from ray.train import ScalingConfig
from ray.train.torch import TorchTrainer

import michelangelo.uniflow.core as uniflow
from michelangelo.uniflow.core._console import Reporter
from michelangelo.uniflow.core._records import RunStore, TaskState
from michelangelo.uniflow.core._storage import Storage
from michelangelo.uniflow.core.lib import concurrent
from michelangelo.uniflow.plugins.ray import CapacityError, RayTask

from ._cluster_probe import survivors

BARRIER_S = 120.0  # only reached when the branches do not behave as asserted


def _wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + BARRIER_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"barrier: {what} never happened")
        time.sleep(0.02)


def _mark(folder: str, name: str) -> float:
    now = time.time()
    with open(os.path.join(folder, name + ".tmp"), "w") as handle:
        handle.write(repr(now))
    os.replace(os.path.join(folder, name + ".tmp"), os.path.join(folder, name))
    return now


@ray.remote(num_cpus=1)
def _meet(folder: str, me: int, other: int) -> tuple[float, float]:
    start = _mark(folder, f"start-{me}")
    _wait_for(lambda: os.path.exists(os.path.join(folder, f"start-{other}")),
              f"Ray task {other} starting while {me} runs")
    return start, _mark(folder, f"end-{me}")


SHARED = RayTask(head_cpu=2, head_memory="1Gi")


@uniflow.task(config=SHARED)
def on_cluster(folder: str, me: int) -> dict:
    start, end = ray.get(_meet.remote(folder, me, 1 - me))
    return {"start": start, "end": end, "gcs": ray.get_runtime_context().gcs_address}


@uniflow.workflow()
def two_on_one_cluster(folder: str) -> list[dict]:
    return concurrent.batch_run([concurrent.new_callable(on_cluster, folder, i)
                                 for i in range(2)]).get()


class Lines(Reporter):
    """Keeps what the run says; writes a file when a branch announces that it waits."""

    def __init__(self, folder: str | None = None) -> None:
        self.lines: list[str] = []
        self.folder = folder

    def info(self, message: str) -> None:
        self.lines.append(message)
        if self.folder and "waits for room" in message:
            _mark(self.folder, "announced")


def test_raytask_branches_run_side_by_side_on_one_cluster(tmp_path):
    reporter = Lines()
    ctx = uniflow.Context(reporter=reporter)
    a, b = ctx.run(two_on_one_cluster, str(tmp_path))
    assert b["start"] < a["end"] and a["start"] < b["end"]
    assert a["gcs"] == b["gcs"]  # one cluster, shared
    plan = next(line for line in reporter.lines if line.startswith("batch 001"))
    assert "2 branch(es) of on_cluster, 2 at once" in plan
    assert "has 2 free CPU" in plan and "takes at least 1 CPU" in plan
    store = RunStore(Storage())
    assert {r.call_id: r.state for r in store.load_tasks(ctx.last_run_id)} == {
        "001-on_cluster[0]": TaskState.SUCCEEDED, "001-on_cluster[1]": TaskState.SUCCEEDED}
    assert store.load_run(ctx.last_run_id).batches[0]["at_once"] == 2


@uniflow.workflow()
def two_futures(folder: str) -> list[dict]:
    # The cluster starts inside whichever branch thread comes first; the other waits for it.
    first, second = (concurrent.run(on_cluster, folder, i) for i in range(2))
    return [first.result(), second.result()]


def test_lone_futures_of_raytasks_share_the_cluster_started_in_a_branch(tmp_path):
    ctx = uniflow.Context(reporter=Reporter())
    a, b = ctx.run(two_futures, str(tmp_path))
    assert b["start"] < a["end"] and a["start"] < b["end"]
    assert a["gcs"] == b["gcs"]
    records = RunStore(Storage()).load_tasks(ctx.last_run_id)
    assert [r.call_id for r in records] == ["001-on_cluster", "002-on_cluster"]


def _hold_two_cpus(config: dict) -> None:
    folder, me = config["folder"], config["me"]
    _mark(folder, f"train-start-{me}")
    if me == 0:
        # Hold the whole cluster until branch 1 has said that it waits for room.
        _wait_for(lambda: os.path.exists(os.path.join(folder, "announced")),
                  "the other fit announcing that it waits")
    _mark(folder, f"train-end-{me}")


@uniflow.task(config=SHARED)
def fit_two_cpus(folder: str, me: int, cpus: int) -> str:
    if me == 1:  # branch 1 dispatches only once branch 0's fit holds the cluster
        _wait_for(lambda: os.path.exists(os.path.join(folder, "train-start-0")),
                  "branch 0 training")
    TorchTrainer(_hold_two_cpus, train_loop_config={"folder": folder, "me": me},
                 scaling_config=ScalingConfig(num_workers=1,
                                              resources_per_worker={"CPU": cpus})).fit()
    return "fitted"


@uniflow.workflow()
def capacity(folder: str) -> list:
    batch = concurrent.batch_run([concurrent.new_callable(fit_two_cpus, folder, 0, 2),
                                  concurrent.new_callable(fit_two_cpus, folder, 1, 2),
                                  concurrent.new_callable(fit_two_cpus, folder, 2, 3)])
    futures = batch.get_futures()
    return [f.exception() for f in futures]


def test_fits_that_share_a_cluster_wait_for_room_and_never_oversubscribe_it(tmp_path):
    folder = str(tmp_path)
    reporter = Lines(folder)
    errors = uniflow.Context(reporter=reporter).run(capacity, folder)
    assert errors[0] is None and errors[1] is None
    # Three CPUs can never fit a 2-CPU cluster: that branch fails at once, as without batches.
    assert isinstance(errors[2], CapacityError) and "fit_two_cpus[2]" in str(errors[2])

    def read(name: str) -> float:
        with open(os.path.join(folder, name)) as handle:
            return float(handle.read())

    # Branch 1's worker started only after branch 0's ended: never both on two CPUs.
    assert read("train-start-1") > read("train-end-0")
    waits = [line for line in reporter.lines if "waits for room" in line]
    assert len(waits) == 1 and "001-fit_two_cpus[1]" in waits[0]
    assert "held by 001-fit_two_cpus[0]" in waits[0]


SCRIPT = textwrap.dedent(
    """
    import json, os, sys, time
    import ray
    import michelangelo.uniflow.core as uniflow
    from michelangelo.uniflow.core._console import Reporter
    from michelangelo.uniflow.core.lib import concurrent
    from michelangelo.uniflow.plugins.ray import RayTask
    sys.path.insert(0, {probe_dir!r})
    from _cluster_probe import cluster_sessions

    @ray.remote(num_cpus=1)
    def forever():
        time.sleep(600)

    @uniflow.task(config=RayTask(head_cpu=2))
    def spin(me: int):
        with open({folder!r} + f"/sessions-{{me}}.tmp", "w") as f:
            json.dump(cluster_sessions(), f)
        os.replace({folder!r} + f"/sessions-{{me}}.tmp", {folder!r} + f"/sessions-{{me}}")
        ray.get(forever.remote())

    @uniflow.workflow()
    def wf():
        return concurrent.batch_run([concurrent.new_callable(spin, i) for i in range(2)]).get()

    if __name__ == "__main__":
        uniflow.Context(reporter=Reporter()).run(wf)
    """
)


def test_ctrl_c_stops_every_branch_and_removes_the_cluster(tmp_path):
    script = tmp_path / "wf.py"
    script.write_text(SCRIPT.format(probe_dir=os.path.dirname(__file__), folder=str(tmp_path)))
    proc = subprocess.Popen([sys.executable, str(script)], env=dict(os.environ),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _wait_for(lambda: proc.poll() is not None or all(
            (tmp_path / f"sessions-{i}").exists() for i in range(2)), "both branches running")
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
        sessions = json.loads((tmp_path / "sessions-0").read_text())
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    assert survivors(sessions) == []
