"""`michelangelo cluster up|status|down` and `michelangelo serve`, run as a user runs them."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request

import psutil
import pytest

BIN = os.path.join(os.path.dirname(sys.executable), "michelangelo")

WORKFLOW = textwrap.dedent(
    """
    import ray
    import michelangelo.uniflow.core as uniflow
    from michelangelo.uniflow.plugins.ray import RayTask

    @uniflow.task(config=RayTask(head_cpu=1))
    def where() -> str:
        return ray.get_runtime_context().gcs_address

    @uniflow.workflow()
    def main() -> str:
        return where()
    """
)

FACTORY = textwrap.dedent(
    """
    import torch

    def create_model():
        return torch.nn.Linear(3, 1)
    """
)


def _cli(*args, env, timeout=600):
    return subprocess.run([BIN, *args], env=env, capture_output=True, text=True, timeout=timeout)


def _session_members(leaders):
    found = []
    for proc in psutil.process_iter():
        try:
            if os.getsid(proc.pid) in leaders:
                found.append(proc.pid)
        except OSError:
            continue
    return found


def _ray_sessions_of(pid: int) -> set[int]:
    """The Ray node processes (each the leader of its own session) that ``pid`` started."""
    try:
        return {p.pid for p in psutil.Process(pid).children()
                if "ray" in " ".join(p.cmdline())}
    except psutil.Error:
        return set()


@pytest.fixture
def cli_env(tmp_path):
    env = dict(os.environ, MA_CLUSTER_FILE=str(tmp_path / "cluster.json"))
    env.pop("RAY_ADDRESS", None)
    return env


def test_cluster_up_runs_attach_and_down_leaves_nothing(tmp_path, cli_env):
    (tmp_path / "wf.py").write_text(WORKFLOW)
    try:
        up = _cli("cluster", "up", "--cpus", "1", "--workers", "0", "--memory", "1Gi",
                  env=cli_env)
        assert up.returncode == 0, up.stdout + up.stderr
        assert "cluster up at" in up.stdout and "dashboard: http://127.0.0.1:" in up.stdout
        with open(cli_env["MA_CLUSTER_FILE"]) as handle:
            record = json.load(handle)
        status = _cli("cluster", "status", env=cli_env)
        assert status.returncode == 0 and record["address"] in status.stdout
        again = _cli("cluster", "up", env=cli_env)
        assert again.returncode == 1 and "already up" in again.stderr

        run = _cli("run", f"{tmp_path / 'wf.py'}:main", env=cli_env)
        assert run.returncode == 0, run.stdout + run.stderr
        assert f"result: '{record['address']}'" in run.stdout  # the run borrowed the cluster
        assert "cluster up at" in _cli("cluster", "status", env=cli_env).stdout  # and left it
    finally:
        down = _cli("cluster", "down", env=cli_env)
    assert down.returncode == 0 and "stopped the cluster" in down.stdout, down.stderr
    assert _session_members(set(record["node_pids"])) == []
    assert not os.path.exists(cli_env["MA_CLUSTER_FILE"])
    assert "no cluster is up" in _cli("cluster", "status", env=cli_env).stdout


def test_serve_answers_then_ctrl_c_leaves_no_ray_process(tmp_path, cli_env, monkeypatch):
    import torch

    (tmp_path / "cli_serving_factory.py").write_text(FACTORY)
    monkeypatch.syspath_prepend(str(tmp_path))
    import cli_serving_factory

    from michelangelo.lib.model_registry import ModelRegistry
    from michelangelo.uniflow.plugins.ray.provisioning import free_port

    registry = ModelRegistry(str(tmp_path / "registry"))
    registry.register("cli", "lin", model=cli_serving_factory.create_model(),
                      create_model_fn=cli_serving_factory.create_model,
                      input_example=torch.ones(2, 3))
    bad = _cli("serve", "cli/missing", "--registry", registry.url, env=cli_env)
    assert bad.returncode == 1 and "missing" in bad.stderr  # refused before any cluster starts

    port = free_port()
    env = dict(cli_env, PYTHONPATH=os.pathsep.join([str(tmp_path), cli_env.get("PYTHONPATH", "")]))
    # As in a terminal, where Ctrl-C reaches the program: a test runner started in the
    # background may hand its children an ignored SIGINT, which Python then keeps ignoring.
    proc = subprocess.Popen([BIN, "serve", "cli/lin:1",
                             "--port", str(port), "--registry", registry.url],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    lines = []
    nodes: set[int] = set()
    stopped = False  # whether serve went through its own Ctrl-C
    try:
        deadline = time.monotonic() + 540
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if line.startswith("Ctrl-C to stop"):
                break
        assert lines and lines[-1].startswith("Ctrl-C"), "".join(lines)[-4000:]
        url = next(ln.split(" at ", 1)[1].strip() for ln in lines if ln.startswith("serving "))
        assert url == f"http://127.0.0.1:{port}/cli-lin"
        body = json.dumps({"inputs": [[1.0, 2.0, 3.0]]}).encode()
        with urllib.request.urlopen(urllib.request.Request(url, data=body, method="POST"),
                                    timeout=60) as resp:
            answer = json.loads(resp.read())
        assert len(answer["predictions"]) == 1 and answer["model"]["revision_id"] == 1
        # As quiet as a run: our lines only; Ray's and Serve's go to the log file.
        noise = [ln for ln in lines if "INFO" in ln or "Serve" in ln or "pid=" in ln]
        assert noise == [], "".join(lines)
        assert f"http://127.0.0.1:{port}/v2/models/cli-lin" in "".join(lines)
        log = lines[0].split("(logs: ", 1)[1].split(")", 1)[0]
        family = {p.pid for p in psutil.Process(proc.pid).children(recursive=True)}
        nodes = _ray_sessions_of(proc.pid)
        assert nodes, "serve started no Ray node of its own"
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=300)
        except subprocess.TimeoutExpired:
            raise AssertionError("serve did not stop within 300 s of Ctrl-C; its output:\n"
                                 + "".join(lines)) from None
        stopped = True
    finally:
        if not stopped:
            # A failed assertion above skipped the Ctrl-C: end serve's Ray nodes as well, so
            # that a failing test leaves no cluster behind for the rest of the suite.
            leftovers = nodes or _ray_sessions_of(proc.pid)
            if proc.poll() is None:
                proc.kill()
            for pid in _session_members(leftovers):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
    assert proc.returncode == 130, "".join(lines) + proc.stdout.read()
    with open(log) as handle:
        assert "Serve" in handle.read()  # Serve's own lines were kept, in the log
    alive = [pid for pid in family if psutil.pid_exists(pid)
             and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    assert alive == [] and _session_members(nodes) == []


def test_stale_record_and_no_cluster_are_reported_in_one_line(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from michelangelo.cli._main import cli

    record = tmp_path / "cluster.json"
    monkeypatch.setenv("MA_CLUSTER_FILE", str(record))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    record.write_text(json.dumps({
        "address": "127.0.0.1:1", "dashboard_url": None, "node_pids": [dead.pid],
        "temp_dir": str(tmp_path / "gone"), "log_dir": str(tmp_path), "task": {},
        "auth_mode": "disabled", "started_at": 0.0}))
    status = CliRunner().invoke(cli, ["cluster", "status"])
    assert status.exit_code == 1 and "is gone" in status.output
    listed = CliRunner().invoke(cli, ["deployments", "list"])
    assert listed.exit_code == 1 and "no Ray cluster to deploy on" in listed.output
    assert "michelangelo cluster up" in listed.output
    down = CliRunner().invoke(cli, ["cluster", "down"])
    assert down.exit_code == 0 and not record.exists()
    assert "no cluster is up" in CliRunner().invoke(cli, ["cluster", "status"]).output
