"""The sandbox end to end, as a user drives it: create, status, a refusal, Ctrl-C, the
quickstart and its RayService answering over HTTP on 127.0.0.1, then delete, leaving nothing.

The tests run in this file's order on one sandbox (see conftest.py): the last one deletes it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request

import pytest

from tests.sandbox.e2e.conftest import (
    BIN,
    REPO,
    cli_env,
    kube_list,
    michelangelo,
    ours_in_docker,
)

pytestmark = [pytest.mark.sandbox, pytest.mark.timeout(3600)]
QUICKSTART = os.path.join(REPO, "examples", "quickstart", "workflow.py")
WORKFLOWS = os.path.join(REPO, "tests", "sandbox", "e2e", "_workflows.py")
STORAGE = "s3://michelangelo/uniflow"
NODE = "michelangelo-control-plane"


def _ray_pods() -> list[dict]:
    return kube_list("pods", selector="ray.io/is-ray-node=yes")


def _nothing_of_runs_left(timeout: float = 120) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not kube_list("rayclusters") and not _ray_pods():
            return True
        time.sleep(1)
    return False


def _whole_log_command(output: str) -> list[str]:
    (line,) = [ln for ln in output.splitlines() if "whole log: michelangelo runs logs" in ln][:1]
    return line.split("whole log: michelangelo ", 1)[1].split()


def test_status_shows_every_part_ready(sandbox):
    assert "sandbox ready:" in sandbox and "michelangelo-sandbox:" in sandbox
    status = michelangelo("sandbox", "status", timeout=120).stdout
    for part in ("kind cluster", "KubeRay", "MinIO", "image"):
        assert part.lower() in status.lower(), status


def test_a_raytask_too_big_for_the_node_is_refused_with_the_nodes_numbers(sandbox):
    done = michelangelo("run", f"{WORKFLOWS}:too_big", "--kuberay", "--sandbox",
                        check=False, timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode != 0
    assert "asks for" in output and "memory 512" in output, output[-3000:]
    assert f"the largest node '{NODE}' has" in output and "free" in output, output[-3000:]
    assert "Fix: shrink the RayTask's worker_* fields" in output
    assert kube_list("rayclusters") == []  # refused before anything was made
    # The failure's hint works from a plain shell: the storage is named, and the sandbox's
    # credentials reach its bucket.
    logs = michelangelo(*_whole_log_command(output), timeout=120)
    assert logs.returncode == 0


def test_ctrl_c_while_a_raycluster_provisions_deletes_it(sandbox):
    proc = subprocess.Popen(
        [os.path.join(BIN, "michelangelo"), "run", f"{QUICKSTART}:quickstart", "--kuberay",
         "--sandbox", "--arg", "n_rows=400", "--arg", "epochs=1"],
        env=cli_env(), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)  # a terminal's foreground group: Ctrl-C reaches all of it
    try:
        deadline = time.monotonic() + 300
        while not kube_list("rayclusters"):
            assert proc.poll() is None, proc.stdout.read()[-3000:]
            assert time.monotonic() < deadline, "no RayCluster appeared"
            time.sleep(0.5)
        (cluster,) = kube_list("rayclusters")
        name = cluster["metadata"]["name"]
        os.killpg(proc.pid, signal.SIGINT)
        output, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    print(output[-6000:])
    assert proc.returncode != 0
    assert f"RayCluster michelangelo/{name} deleted" in output, output[-3000:]
    assert _nothing_of_runs_left(), "the RayCluster or its pods outlived the Ctrl-C"
    runs = michelangelo("runs", "list", "--storage-url", STORAGE, timeout=120).stdout
    (row,) = [ln for ln in runs.splitlines() if "quickstart" in ln][:1]
    assert "running" not in row, runs


def test_quickstart_trains_registers_and_serves_as_a_rayservice(sandbox):
    done = michelangelo("run", f"{QUICKSTART}:quickstart", "--kuberay", "--sandbox",
                        "--arg", "n_rows=1000", "--arg", "epochs=1", timeout=1800)
    output = done.stdout + done.stderr
    assert "RayService michelangelo/quickstart: creating with quickstart/regressor:" in output
    ready = [ln for ln in output.splitlines() if "RayService michelangelo/quickstart: ready" in ln]
    assert ready and "quickstart RUNNING" in ready[-1], output[-4000:]
    # The run's own clusters are gone; the RayService's stays, with its pods Ready.
    (service,) = kube_list("rayservices")
    active = service["status"]["activeServiceStatus"]["rayClusterName"]
    assert [c["metadata"]["name"] for c in kube_list("rayclusters")] == [active]
    # Its endpoint answers on this machine: kind maps the serve node port to 127.0.0.1:8000.
    request = urllib.request.Request(
        "http://127.0.0.1:8000/quickstart", method="POST",
        data=json.dumps({"inputs": [[0.1] * 8, [0.0] * 8]}).encode(),
        headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as answer:
        assert len(json.load(answer)["predictions"]) == 2
    import numpy as np
    import tritonclient.http as triton

    client = triton.InferenceServerClient("127.0.0.1:8000")
    try:
        assert client.is_server_ready() and client.is_model_ready("quickstart")
        tensor = triton.InferInput("input", [1, 8], "FP32")
        tensor.set_data_from_numpy(np.full((1, 8), 0.1, dtype=np.float32))
        result = client.infer("quickstart", [tensor])
        assert result.as_numpy(result.get_response()["outputs"][0]["name"]).shape[0] == 1
    finally:
        client.close()


def test_delete_leaves_no_container_network_volume_or_cluster(sandbox, before_sandbox):
    done = michelangelo("sandbox", "delete", timeout=600)
    assert "deleting kind cluster 'michelangelo'" in done.stdout
    after = ours_in_docker()
    for what, names in after.items():
        left = names - before_sandbox[what]
        assert not left, f"{what} left after 'sandbox delete': {sorted(left)}"
    assert "michelangelo" not in after["kind clusters"]
    assert not any(n.startswith("michelangelo-control-plane") for n in after["containers"])
