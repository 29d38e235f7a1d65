"""A real Ray cluster for the remote-run tests: `ray start --head` plus worker nodes.

Each node is a `ray start --block` process in its own session, on loopback, with a private
temp dir and free ports, and token auth on (a token made for the test, passed through
RAY_AUTH_TOKEN: ~/.ray is never touched). Stopping it ends only those sessions.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

import psutil

from michelangelo.uniflow.plugins.ray.provisioning import free_port

BIN = os.path.dirname(sys.executable)


@dataclass
class RemoteCluster:
    dashboard_url: str
    token: str
    temp_dir: str
    procs: list[subprocess.Popen] = field(default_factory=list)
    logs: list[str] = field(default_factory=list)

    def client_env(self, storage: str, *, token: bool = True) -> dict[str, str]:
        """Environment of a client process talking to this cluster."""
        env = dict(os.environ)
        env.pop("RAY_ADDRESS", None)
        env["UF_STORAGE_URL"] = storage
        env["PATH"] = BIN + os.pathsep + env.get("PATH", "")
        env["RAY_AUTH_MODE"] = "token"
        if token:
            env["RAY_AUTH_TOKEN"] = self.token
        else:
            env.pop("RAY_AUTH_TOKEN", None)
            env["RAY_AUTH_TOKEN_PATH"] = os.path.join(self.temp_dir, "no-token-here")
        return env

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def sessions(self) -> set[int]:
        return {proc.pid for proc in self.procs}


def _node_env(token: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    env.update({
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": token,
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",
        # Jobs run `python`: the cluster's Python is this virtualenv's, as in a Ray image.
        "PATH": BIN + os.pathsep + env.get("PATH", ""),
    })
    return env


def start(workers: list[dict[str, str]], head: dict[str, str], log_dir: str,
          timeout_s: float = 240) -> RemoteCluster:
    """Start a head and ``workers`` (each a dict of ``ray start`` resource flags).

    On a loaded machine a head can die after starting (its client server times out waiting
    for the GCS); then the whole cluster is stopped and started again, up to three times.
    """
    for attempt in range(3):
        try:
            return _start_once(workers, head, log_dir, timeout_s)
        except NodeExited:
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def _start_once(workers: list[dict[str, str]], head: dict[str, str], log_dir: str,
                timeout_s: float) -> RemoteCluster:
    token = secrets.token_hex(16)
    temp_dir = tempfile.mkdtemp(prefix="uf-remote-test-", dir="/tmp")
    port, dashboard = free_port(), free_port()
    cluster = RemoteCluster(f"http://127.0.0.1:{dashboard}", token, temp_dir)
    env = _node_env(token)

    def spawn(name: str, args: list[str]) -> None:
        log = os.path.join(log_dir, f"{name}.log")
        cluster.logs.append(log)
        with open(log, "wb") as handle:
            cluster.procs.append(subprocess.Popen(
                [os.path.join(BIN, "ray"), "start", "--block", "--disable-usage-stats", *args],
                stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                start_new_session=True))

    def started(name: str, args: list[str]) -> None:
        # `ray start` gives a node 30 s to register; on a loaded machine that can run out,
        # and the node exits: start it again (a few times) rather than fail the module.
        for attempt in range(5):
            spawn(name, args)
            try:
                _wait(lambda: _log_has(cluster.logs[-1], b"Ray runtime started"), cluster,
                      timeout_s)
                return
            except NodeExited as exc:
                if attempt == 4 or exc.proc is not cluster.procs[-1]:
                    raise  # an earlier node (the head) died: start over
                cluster.procs.pop()
                cluster.logs.pop()

    try:
        started("head", [
            "--head", f"--port={port}", f"--temp-dir={temp_dir}",
            f"--dashboard-port={dashboard}", "--dashboard-host=127.0.0.1",
            f"--dashboard-agent-listen-port={free_port()}",
            f"--ray-client-server-port={free_port()}", f"--metrics-export-port={free_port()}",
            *_flags(head),
        ])
        from ray._private.services import get_node_ip_address

        address = f"{get_node_ip_address()}:{port}"
        for index, worker in enumerate(workers):
            # A node of its own temp dir, as on separate hosts: nodes sharing one would also
            # share Ray's unpacked runtime envs, and each node's agent re-unpacks (deletes,
            # then writes) a working_dir it has not cached yet under the jobs already in it.
            node_dir = os.path.join(temp_dir, f"w{index}")
            os.makedirs(node_dir)
            started(f"worker-{index}", [
                f"--address={address}", f"--temp-dir={node_dir}",
                f"--dashboard-agent-listen-port={free_port()}",
                f"--metrics-export-port={free_port()}", *_flags(worker),
            ])
        _wait(lambda: _alive_nodes(cluster) >= 1 + len(workers), cluster, timeout_s)
    except BaseException:
        stop(cluster)
        raise
    return cluster


def stop(cluster: RemoteCluster) -> None:
    """End the nodes this helper started (their whole sessions), and nothing else."""
    for proc in reversed(cluster.procs):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    for proc in reversed(cluster.procs):
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
    sessions = cluster.sessions()
    for _ in range(3):
        left = []
        for proc in psutil.process_iter():
            with contextlib.suppress(psutil.Error, ProcessLookupError, PermissionError):
                if os.getsid(proc.pid) in sessions:
                    proc.kill()
                    left.append(proc)
        if not left:
            break
        psutil.wait_procs(left, timeout=5)
    import shutil

    shutil.rmtree(cluster.temp_dir, ignore_errors=True)


def survivors(sessions: set[int]) -> list[str]:
    alive = []
    for proc in psutil.process_iter(["pid", "name", "status"]):
        with contextlib.suppress(psutil.Error, ProcessLookupError, PermissionError):
            if proc.info["status"] != psutil.STATUS_ZOMBIE and os.getsid(proc.pid) in sessions:
                alive.append(f"{proc.pid}:{proc.info['name']}")
    return alive


def _end_session(proc: subprocess.Popen) -> None:
    """Kill what a failed node left in its session (e.g. a GCS whose raylet gave up)."""
    for other in psutil.process_iter():
        with contextlib.suppress(psutil.Error, ProcessLookupError, PermissionError):
            if os.getsid(other.pid) == proc.pid:
                other.kill()


def _flags(resources: dict[str, str]) -> list[str]:
    return [f"--{key}={value}" for key, value in resources.items()]


def _log_has(path: str, needle: bytes) -> bool:
    try:
        with open(path, "rb") as handle:
            return needle in handle.read()
    except OSError:
        return False


def _alive_nodes(cluster: RemoteCluster) -> int:
    import requests

    try:
        response = requests.get(f"{cluster.dashboard_url}/api/v0/nodes?detail=1&limit=100",
                                headers=cluster.headers(), timeout=10)
        rows = response.json()["data"]["result"]["result"]
    except Exception:
        return 0
    return sum(1 for row in rows if row.get("state") == "ALIVE")


class NodeExited(RuntimeError):
    """A `ray start` process of the test cluster ended while starting."""

    def __init__(self, message: str, proc: subprocess.Popen) -> None:
        super().__init__(message)
        self.proc = proc


def _wait(condition, cluster: RemoteCluster, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        for proc, log in zip(cluster.procs, cluster.logs, strict=True):
            if proc.poll() is not None:
                with open(log, errors="replace") as handle:
                    tail = handle.read()[-3000:]
                _end_session(proc)
                raise NodeExited(f"a test Ray node exited ({proc.returncode}):\n{tail}", proc)
        if time.monotonic() > deadline:
            raise TimeoutError(f"the test Ray cluster was not up within {timeout_s:.0f}s")
        time.sleep(0.25)
