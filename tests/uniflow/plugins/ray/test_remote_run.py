"""remote-run against a real Ray cluster (ray start --head + 2 worker nodes, token auth on).

Clients are separate processes, as a user runs them: `python wf.py remote-run --ray-address
URL` and `michelangelo run FILE:WF --ray-address URL`. The cluster and the clients share a
local storage folder, as they would share a bucket.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from ray.job_submission import JobSubmissionClient

from michelangelo.uniflow.core._records import RunStore, TaskState
from michelangelo.uniflow.core._storage import Storage
from michelangelo.uniflow.core.errors import UserError
from michelangelo.uniflow.plugins.ray._remote._jobs import compare_versions
from michelangelo.uniflow.plugins.ray.provisioning import free_port

from . import _remote_cluster

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", "..", "..", ".."))
WORKFLOWS = os.path.join(HERE, "_remote_workflows.py")
NODE = {"memory": str(2 * 2**30), "object-store-memory": str(100 * 2**20)}
TIMEOUT_S = 900
# One cluster start plus several client runs share the module's fixtures; on a loaded
# machine `ray start` alone can take minutes, so the fixture-heavy first test gets room.
pytestmark = pytest.mark.timeout(1800)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    logs = tmp_path_factory.mktemp("remote-cluster-logs")
    # The quickstart's RayTask: a 1-CPU head with 4 GiB and two 2-CPU workers with 2 GiB.
    remote = _remote_cluster.start(
        workers=[{"num-cpus": "2", **NODE}, {"num-cpus": "2", **NODE}],
        head={"num-cpus": "1", **NODE, "memory": str(4 * 2**30)},
        log_dir=str(logs),
    )
    try:
        yield remote
    finally:
        _remote_cluster.stop(remote)
        assert _remote_cluster.survivors(remote.sessions()) == []


@pytest.fixture(scope="module")
def storage(tmp_path_factory):
    return str(tmp_path_factory.mktemp("remote-storage"))


def _run(cmd: list[str], env: dict, timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout,
                          cwd=REPO)


def _jobs(cluster) -> JobSubmissionClient:
    return JobSubmissionClient(cluster.dashboard_url, headers=cluster.headers())


def _tasks(storage: str, run_id: str) -> dict:
    return {r.call_id: r for r in RunStore(Storage(storage)).load_tasks(run_id)}


def _run_id(output: str) -> str:
    for line in output.splitlines():
        if line.startswith("run id: "):
            return line.split(": ", 1)[1].strip()
    for line in output.splitlines():  # a failed run: its id is in the run's first event
        if "run " in line and " started" in line:
            return line.split("run ", 1)[1].split()[0]
    raise AssertionError(f"no run id in:\n{output}")


def _log(storage: str, run_id: str, call_id: str, attempt: int) -> str:
    path = os.path.join(storage, "runs", run_id, "tasks", call_id, "logs",
                        f"attempt-{attempt}.log")
    with open(path, errors="replace") as handle:
        return handle.read()


@pytest.fixture(scope="module")
def feature_runs(cluster, storage, tmp_path_factory):
    """Run 1 fails in its last task; run 2 resumes it once the task can succeed."""
    scratch = tmp_path_factory.mktemp("remote-flags")
    env = cluster.client_env(storage)
    env.update(WF_MARKER=str(scratch / "marker"), WF_FLAG=str(scratch / "flag"))
    command = [sys.executable, WORKFLOWS, "remote-run", "--ray-address", cluster.dashboard_url]
    # UF_DEBUG=1 keeps Python's traceback (with the remote one noted on the exception) after
    # the console's summary; without it, whether the job's last lines reach the summary
    # depends on when Ray's log tail catches up.
    first = _run(command, {**env, "UF_DEBUG": "1"})
    first_id = _run_id(first.stdout + first.stderr)
    (scratch / "flag").write_text("present")
    second = _run([*command, "--resume", first_id], env)
    return {"first": first, "first_id": first_id, "second": second,
            "second_id": _run_id(second.stdout + second.stderr)}


def test_failing_task_error_and_output_reach_the_client(feature_runs, storage, cluster):
    first, run_id = feature_runs["first"], feature_runs["first_id"]
    assert first.returncode != 0
    # The user's own exception type, message prefixed with the task, remote traceback noted.
    assert "FlagMissing: task 'fragile' failed: flag file" in first.stderr
    assert "remote traceback" in first.stderr and "in fragile" in first.stderr
    record = _tasks(storage, run_id)["004-fragile"]
    assert record.state == TaskState.FAILED and record.error["type"] == "FlagMissing"
    # The job's output (the body's prints) streamed into the attempt's log on the client.
    assert "fragile looks for" in _log(storage, run_id, "004-fragile", 1)
    assert cluster.token not in first.stdout + first.stderr


def test_retried_task_runs_a_second_job(feature_runs, storage):
    record = _tasks(storage, feature_runs["first_id"])["001-flaky"]
    assert record.state == TaskState.SUCCEEDED and record.attempts == 2
    assert "first attempt fails on purpose" in _log(storage, feature_runs["first_id"],
                                                    "001-flaky", 1)


def test_cached_task_is_served_without_a_job(feature_runs, storage):
    tasks = _tasks(storage, feature_runs["first_id"])
    assert tasks["002-cached"].state == TaskState.SUCCEEDED
    assert tasks["003-cached"].state == TaskState.CACHED
    assert tasks["003-cached"].source_run == feature_runs["first_id"]
    assert not os.path.exists(os.path.join(storage, "runs", feature_runs["first_id"], "tasks",
                                           "003-cached", "remote-1"))


def test_resumed_run_reuses_and_finishes_on_the_cluster(feature_runs, storage):
    second = feature_runs["second"]
    assert second.returncode == 0, second.stderr[-4000:]
    tasks = _tasks(storage, feature_runs["second_id"])
    assert tasks["001-flaky"].state == TaskState.REUSED
    assert tasks["002-cached"].state == TaskState.REUSED
    assert tasks["004-fragile"].state == TaskState.SUCCEEDED
    result = second.stdout.split("result: ", 1)[1]
    assert "'fragile ok'" in result and "'value': 42" in result
    # The bodies ran in job processes on the cluster, in the unpacked project folder.
    assert "working_dir_files" in result and f"'pid': {os.getpid()}" not in result


def test_a_batch_runs_its_branches_as_concurrent_jobs(cluster, storage, tmp_path):
    env = cluster.client_env(storage)
    # An SDK setting the client sets (and checks when the run starts) reaches every job.
    env.update(WF="batch", WF_MEET=str(tmp_path), MA_TRAINER_INMEMORY="off")
    done = _run([sys.executable, WORKFLOWS, "remote-run", "--ray-address",
                 cluster.dashboard_url], env)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    # The plan line says why two at once: the cluster holds two copies of the branch's nodes.
    assert "2 branch(es) of meet, 2 at once" in output and "each a Ray job" in output
    run_id = _run_id(output)
    tasks = _tasks(storage, run_id)
    assert {k: v.state for k, v in tasks.items()} == {
        "001-meet[0]": TaskState.SUCCEEDED, "001-meet[1]": TaskState.SUCCEEDED}
    # Each job saw the other one start: they ran at the same time, each in its own
    # process in the unpacked project folder (the shared working_dir stayed in place).
    result = done.stdout.split("result: ", 1)[1]
    assert result.count("'seen': 2") == 2, result
    assert result.count("working_dir_files") == 2, result
    assert result.count("'inmemory': 'off'") == 2, result
    for call_id, x in (("001-meet[0]", 1), ("001-meet[1]", 2)):
        assert f"meet body runs for x={x}" in _log(storage, run_id, call_id, 1)


def test_quickstart_through_the_cli_with_ray_address(cluster, storage):
    quickstart = os.path.join(REPO, "examples", "quickstart", "workflow.py")
    args = ["--arg", "n_rows=400", "--arg", "epochs=1"]
    with open(quickstart) as handle:
        if "port: int" in handle.read():  # the quickstart that also serves the model
            args += ["--arg", f"port={free_port()}"]
    done = _run([os.path.join(os.path.dirname(sys.executable), "michelangelo"), "run",
                 f"{quickstart}:quickstart", *args, "--ray-address", cluster.dashboard_url],
                cluster.client_env(storage))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    run_id = _run_id(done.stdout)
    tasks = _tasks(storage, run_id)
    assert all(t.state == TaskState.SUCCEEDED for t in tasks.values()), tasks
    # The RayTasks ran as jobs on the cluster (a call description per attempt).
    for call_id in ("001-prepare", "002-train"):
        assert os.path.isdir(os.path.join(storage, "runs", run_id, "tasks", call_id,
                                          "remote-1"))
    logs = "".join(_log(storage, run_id, call_id, 1) for call_id in tasks)
    assert "Running entrypoint for job" in logs  # the job's output reached the task's log
    # Where the time went: the job's start (seen here), then the training's own phases,
    # recorded inside the job and carried back with its result.
    from michelangelo.uniflow.core import task_phases, task_usage

    train = [name for name, _ in task_phases(tasks["002-train"])]
    assert train == ["job start", "Ray Train start", "model and data", "fit",
                     "checkpoint and shutdown"], train
    assert task_usage(tasks["002-train"]).cpu_h > 0
    assert cluster.token not in done.stdout + done.stderr + logs


def test_missing_token_is_refused_without_showing_any_token(cluster, storage):
    env = cluster.client_env(storage, token=False)
    env.update(WF_MARKER="/nonexistent/m", WF_FLAG="/nonexistent/f")
    done = _run([sys.executable, WORKFLOWS, "remote-run", "--ray-address",
                 cluster.dashboard_url], env)
    assert done.returncode != 0
    assert "Authentication" in done.stderr or "authentication" in done.stderr
    assert cluster.token not in done.stdout + done.stderr


def test_capacity_is_checked_against_the_live_nodes_before_any_job(cluster, storage):
    before = len(_jobs(cluster).list_jobs())
    env = cluster.client_env(storage)
    env["WF"] = "huge"
    done = _run([sys.executable, WORKFLOWS, "remote-run", "--ray-address",
                 cluster.dashboard_url], env)
    assert done.returncode != 0
    assert "CapacityError" in done.stderr and "no free node for the worker-0 node" in done.stderr
    assert "64 CPU" in done.stderr
    assert len(_jobs(cluster).list_jobs()) == before


def test_version_mismatch_names_both_sides(cluster):
    import ray
    import requests

    address = cluster.dashboard_url
    ray_version = requests.get(f"{address}/api/version", headers=cluster.headers(),
                               timeout=30).json()["ray_version"]
    meta = requests.get(f"{address}/api/v0/cluster_metadata", headers=cluster.headers(),
                        timeout=30).json()["data"]
    live = {"ray": ray_version, "python": meta["pythonVersion"]}
    here = {"ray": ray.__version__, "python": ".".join(map(str, sys.version_info[:3]))}
    compare_versions(here, live, address)  # this machine and the test cluster agree
    with pytest.raises(UserError) as caught:
        compare_versions({"ray": "2.9.3", "python": "3.10.14"}, live, address)
    message = str(caught.value)
    assert "Ray 2.9.3 on Python 3.10.14" in message
    assert f"Ray {live['ray']} on Python {live['python']}" in message


def _ctrl_c_once_sleepers_run(cluster, storage, workflow: str, count: int) -> list[str]:
    """Start ``workflow`` (sleepers of 300 s), press Ctrl-C once ``count`` of its sleeper
    jobs run, and return the jobs' end states."""
    env = cluster.client_env(storage)
    env.update(WF=workflow, WF_SECONDS="300")
    proc = subprocess.Popen([sys.executable, WORKFLOWS, "remote-run", "--ray-address",
                             cluster.dashboard_url], env=env, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    client = _jobs(cluster)
    jobs: list[str] = []
    deadline = time.monotonic() + 600
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            jobs = [j.submission_id for j in client.list_jobs()
                    if "sleeper" in (j.submission_id or "") and j.status == "RUNNING"
                    and "sleeper started" in client.get_job_logs(j.submission_id)]
            if len(jobs) == count:
                break
            time.sleep(0.5)
        assert len(jobs) == count, f"{count} sleeper job(s) never ran at once: {jobs}"
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    return [str(client.get_job_status(job)).split(".")[-1] for job in jobs]


def test_ctrl_c_stops_the_running_job(cluster, storage):
    assert _ctrl_c_once_sleepers_run(cluster, storage, "slow", 1) == ["STOPPED"]


def test_ctrl_c_stops_every_running_branch_job(cluster, storage):
    assert _ctrl_c_once_sleepers_run(cluster, storage, "slow_batch", 2) == ["STOPPED"] * 2


def _job_python(tmp_path, *, site_packages: bool) -> str:
    """A `python` for the cluster's jobs without this SDK, as on a stock Ray image: this
    interpreter without its site hooks (which is how the editable install is found), with
    its site-packages on PYTHONPATH (the rest of the stack) or without (nothing at all)."""
    import sysconfig

    path = tmp_path / ("python-no-sdk" if site_packages else "python-bare")
    extra = (f'PYTHONPATH="{sysconfig.get_paths()["purelib"]}${{PYTHONPATH:+:$PYTHONPATH}}" '
             if site_packages else "")
    path.write_text(f'#!/bin/sh\n{extra}exec "{sys.executable}" -S "$@"\n')
    path.chmod(0o755)
    return str(path)


def test_a_cluster_python_without_the_sdk_gets_this_clients_copy(cluster, storage, tmp_path):
    env = cluster.client_env(storage)
    env.update(WF="slow", WF_SECONDS="0", UF_RAY_JOB_PYTHON=_job_python(tmp_path,
                                                                       site_packages=True),
               UF_RAY_WORKING_DIR=HERE)  # a project without the package in it
    done = _run([sys.executable, WORKFLOWS, "remote-run", "--ray-address",
                 cluster.dashboard_url], env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    assert "result: 'slept'" in done.stdout
    assert "has no michelangelo; each job carries this client's michelangelo" in \
        done.stdout + done.stderr


def test_a_cluster_python_without_the_stack_fails_before_the_tasks_job(cluster, storage,
                                                                        tmp_path):
    before = {job.submission_id for job in _jobs(cluster).list_jobs()}
    env = cluster.client_env(storage)
    env.update(WF="slow", WF_SECONDS="0", UF_RAY_JOB_PYTHON=_job_python(tmp_path,
                                                                       site_packages=False))
    done = _run([sys.executable, WORKFLOWS, "remote-run", "--ray-address",
                 cluster.dashboard_url], env)
    assert done.returncode != 0
    assert "which lacks ray, fsspec" in done.stderr and "UF_RAY_JOB_PYTHON" in done.stderr
    new = {job.submission_id for job in _jobs(cluster).list_jobs()} - before
    assert new and all(job.startswith("uniflow-probe-") for job in new), new
