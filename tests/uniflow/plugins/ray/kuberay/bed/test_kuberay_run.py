"""remote-run --kuberay end to end: the quickstart on RayClusters the provisioner makes on a
real API server, scheduler and the real KubeRay operator (the kubelet is a test double), then
leak-proofing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from michelangelo.uniflow.core._records import RunStore, TaskState
from michelangelo.uniflow.core._storage import Storage
from michelangelo.uniflow.plugins.ray.kuberay._gc import collect_garbage, managed_clusters
from michelangelo.uniflow.plugins.ray.provisioning import free_port

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), *[".."] * 6))
WORKFLOWS = os.path.join(REPO, "tests", "uniflow", "plugins", "ray", "_remote_workflows.py")
BIN = os.path.dirname(sys.executable)
pytestmark = pytest.mark.timeout(1800)


@pytest.fixture(scope="module")
def storage(tmp_path_factory):
    return str(tmp_path_factory.mktemp("kuberay-storage"))


def _env(plane, storage: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    env.update(UF_STORAGE_URL=storage, KUBECONFIG=str(plane.kubeconfig),
               RAY_AUTH_MODE="disabled", PATH=BIN + os.pathsep + env.get("PATH", ""),
               UF_KUBERAY_PROVISION_TIMEOUT_S="600")
    return env


def _run_id(output: str) -> str:
    for line in output.splitlines():
        if line.startswith("run id: "):
            return line.split(": ", 1)[1].strip()
    raise AssertionError(f"no run id in:\n{output[-3000:]}")


def _no_clusters_left(api, timeout: float = 90) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not api.list("RayCluster", "default") and \
                not api.pods("default", "ray.io/is-ray-node=yes"):
            return True
        time.sleep(0.5)
    return False


def test_quickstart_runs_through_kuberay_and_leaves_nothing(kube_cluster, api, storage):
    plane, kubelet = kube_cluster
    quickstart = os.path.join(REPO, "examples", "quickstart", "workflow.py")
    args = ["--arg", "n_rows=400", "--arg", "epochs=1"]
    with open(quickstart) as handle:
        if "port: int" in handle.read():
            args += ["--arg", f"port={free_port()}"]
    done = subprocess.run(
        [os.path.join(BIN, "michelangelo"), "run", f"{quickstart}:quickstart", *args,
         "--kuberay", "--namespace", "default"],
        env=_env(plane, storage), capture_output=True, text=True, timeout=1500, cwd=REPO)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    run_id = _run_id(done.stdout)
    tasks = {r.call_id: r for r in RunStore(Storage(storage)).load_tasks(run_id)}
    assert all(t.state == TaskState.SUCCEEDED for t in tasks.values()), tasks
    assert "RayCluster default/uf-prepare-" in output and " ready" in output
    assert "deleted" in output
    # deploy() made a lasting RayService from the same description; the run's clusters went
    assert "RayService default/quickstart: creating with quickstart/regressor:" in output
    # Two Serve applications: the endpoint, and the /v2 gateway at the server's root.
    ready = [ln for ln in output.splitlines() if "RayService default/quickstart: ready (" in ln]
    assert ready and "quickstart RUNNING" in ready[-1] and "_oip RUNNING" in ready[-1], output
    assert ready[-1].endswith("; endpoint http://quickstart-serve-svc.default.svc:8000/quickstart")
    service = api.get("RayService", "quickstart", "default")
    assert service["metadata"]["labels"]["uniflow.michelangelo.ai/managed-by"] == \
        "uniflow-serving"
    assert "uniflow.michelangelo.ai/expires-at" not in (service["metadata"].get(
        "annotations") or {})
    active = service["status"]["activeServiceStatus"]["rayClusterName"]
    assert [c["metadata"]["name"] for c in api.list("RayCluster", "default")] == [active]
    (head,) = api.pods("default", f"ray.io/cluster={active},ray.io/node-type=head")
    from michelangelo.lib.serving._client import post_json

    # KubeRay's serve Service sends traffic to every pod that is Ready: the head, and each
    # worker whose own Serve proxy passes the readiness probe KubeRay gave it (a proxy runs
    # where replicas run). Each of them answers.
    ready = [p for p in api.pods("default", f"ray.io/cluster={active}")
             if any(c["type"] == "Ready" and c["status"] == "True"
                    for c in p["status"].get("conditions") or [])]
    assert head["metadata"]["name"] in {p["metadata"]["name"] for p in ready}
    for pod in ready:
        answer = post_json(f"http://{pod['status']['podIP']}:8000/quickstart",
                           {"inputs": [[0.1] * 8, [0.0] * 8]})
        assert len(answer["predictions"]) == 2
    root = post_json(f"http://{head['status']['podIP']}:8000/v2/models/quickstart/infer",
                     {"inputs": [{"name": "input", "shape": [1, 8], "datatype": "FP32",
                                  "data": [0.1] * 8}]})
    assert root["model_name"] == "quickstart" and root["outputs"][0]["shape"][0] == 1
    artifacts = [a for t in tasks.values() for a in t.artifacts]
    kinds = {a["kind"] for a in artifacts}
    assert {"registry_revision", "deployment", "rayservice"} <= kinds  # from the remote jobs too
    assert collect_garbage(api, RunStore(Storage(storage)), dry_run=True) == []  # not a run's
    assert api.delete("RayService", "quickstart", "default")
    assert _no_clusters_left(api)
    deadline = time.monotonic() + 60
    while api.get("RayService", "quickstart", "default") is not None:
        assert time.monotonic() < deadline, "the RayService was not removed"
        time.sleep(0.5)
    assert all(proc.poll() is not None for proc in kubelet.processes())
    assert plane.running("kuberay-operator") and kubelet.errors == []


def _ready_clusters(lines: list[str], task: str) -> set[str]:
    return {ln.split("RayCluster default/", 1)[1].split(" ", 1)[0] for ln in lines
            if f"RayCluster default/uf-{task}-" in ln and " ready; dashboard" in ln}


def _failed_run_id(output: str) -> str:
    for line in output.splitlines():
        if "run " in line and " started" in line:
            return line.split("run ", 1)[1].split()[0]
    raise AssertionError(f"no run id in:\n{output[-3000:]}")


def test_raytask_branches_get_a_raycluster_each_fit_together_and_resume_alone(
        kube_cluster, api, storage, tmp_path):
    """A batch of two RayTasks: a RayCluster each, at the same time (from the times their
    bodies record). A branch that can never fit fails before any cluster starts. Two 3-CPU
    branches (the bed's nodes have 4 and 2 CPU) take turns: one waits, says for what, and
    then reuses the other's cluster; the second fails. --resume runs only the failed ones.
    Every cluster is gone after each run."""
    plane, _ = kube_cluster
    env = _env(plane, storage)
    flag = tmp_path / "flag"
    env.update(WF="kuberay_fanout", WF_FOLDER=str(tmp_path), WF_FLAG=str(flag))
    command = [sys.executable, WORKFLOWS, "remote-run", "--kuberay"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1200,
                          cwd=REPO)
    output = done.stdout + done.stderr
    assert done.returncode != 0 and "FlagMissing: task 'hog' failed" in output, output[-6000:]
    assert _no_clusters_left(api), output[-3000:]
    lines = output.splitlines()
    assert len(_ready_clusters(lines, "stamp")) == 2, output[-4000:]
    assert any("2 branch(es) of stamp, 2 at once" in ln and "a RayCluster per branch" in ln
               for ln in lines), output[-4000:]

    def span(name):
        return tuple(float((tmp_path / f"{name}.{moment}").read_text())
                     for moment in ("start", "end"))

    (start1, end1), (start2, end2) = span("stamp-1"), span("stamp-2")
    assert max(start1, start2) < min(end1, end2)  # each began before the other ended
    # the 64-CPU branch: its own error type, its name, the fix; no cluster was made for it
    assert "ClusterFitError" in output and "task 002-huge failed" in output
    assert "asks for cpu 64" in output and "Fix: shrink the RayTask's worker_* fields" in output
    assert "provisioning RayCluster uf-huge-" not in output
    waits = [ln for ln in lines if " waits for RayCluster(s) " in ln]
    # The second hog waits for the first; the first may also wait, while the idle stamp
    # clusters it retired are still being deleted (how long that takes varies): one line at
    # most per waiting branch, each naming what it asks for.
    assert 1 <= len(waits) <= 2, waits
    assert all("hog waits" in w and "asks for cpu 3" in w for w in waits), waits
    assert len(_ready_clusters(lines, "hog")) == 1, output[-4000:]  # the second reused it
    first, second = sorted([span("hog-1"), span("hog-2")])
    assert first[1] <= second[0]  # one after the other
    assert sum(ln.endswith(" deleted") for ln in lines if "RayCluster default/" in ln) == 3

    first_id = _failed_run_id(output)
    flag.write_text("present")
    again = subprocess.run([*command, "--resume", first_id], env=env, capture_output=True,
                           text=True, timeout=1200, cwd=REPO)
    output = again.stdout + again.stderr
    assert again.returncode == 0, output[-6000:]
    tasks = {r.call_id: r for r in RunStore(Storage(storage)).load_tasks(_run_id(again.stdout))}
    states = {call_id: record.state for call_id, record in tasks.items()}
    assert states == {"001-stamp[0]": TaskState.REUSED, "001-stamp[1]": TaskState.REUSED,
                      "002-huge": TaskState.FAILED, "003-hog": TaskState.REUSED,
                      "004-hog": TaskState.SUCCEEDED}, states
    assert "provisioning RayCluster uf-stamp-" not in output
    assert len(_ready_clusters(output.splitlines(), "hog")) == 1
    assert _no_clusters_left(api), output[-3000:]


def test_sigterm_while_branches_run_deletes_every_cluster(kube_cluster, api, storage):
    plane, kubelet = kube_cluster
    env = _env(plane, storage)
    env.update(WF="slow_pair", WF_SECONDS="600")
    proc = subprocess.Popen([sys.executable, WORKFLOWS, "remote-run", "--kuberay"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=REPO)
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            ready = [c for c in managed_clusters(api, None) if c.ready]
            if len(ready) == 2:
                break
            assert proc.poll() is None, proc.stdout.read()[-3000:]
            time.sleep(1)
        assert len(ready) == 2, "the two branches' RayClusters did not both become ready"
        assert {c.task for c in ready} == {"nap"}
        time.sleep(3)  # let the jobs start
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    deleted = {ln.split("RayCluster default/", 1)[1].split(" ", 1)[0]
               for ln in output.splitlines() if ln.endswith(" deleted") and "RayCluster" in ln}
    assert deleted == {c.name for c in ready}, output[-3000:]
    assert _no_clusters_left(api)
    # The jobs' drivers (sessions of their own in the pods) ended with their pods.
    assert kubelet.stray_processes() == []


def test_gc_removes_clusters_whose_run_is_gone_or_expired(kube_cluster, api, storage):
    from michelangelo.uniflow.plugins.ray import RayTask
    from michelangelo.uniflow.plugins.ray.kuberay._provisioner import KubeRayCluster

    task = RayTask(head_cpu=1, head_memory="1Gi", worker_instances=0)
    orphan = KubeRayCluster(task, run_id="20990101-000000-gone00", task_name="orphan", api=api)
    manifest = orphan.manifest()
    api.create(manifest)  # as if its driver had been SIGKILLed right after creating it
    store = RunStore(Storage(storage))
    listed = {c.name: c for c in managed_clusters(api, store)}
    assert listed[orphan.name].garbage and listed[orphan.name].reason == "its run is not in storage"
    assert collect_garbage(api, store, dry_run=True)[0].name == orphan.name
    assert api.get("RayCluster", orphan.name, "default") is not None
    removed = collect_garbage(api, store)
    assert [c.name for c in removed] == [orphan.name]
    assert _no_clusters_left(api)
