"""A long-lived local Ray cluster (``michelangelo cluster up``) that runs and deploys attach to.

``up`` starts the same ``ray start --block`` processes a run would, waits for every node,
then disconnects and leaves them running; it writes a small JSON file (``MA_CLUSTER_FILE``,
default ``~/.michelangelo/cluster.json``) saying where the cluster is and which processes
are its own. While the file names a live cluster, RayTask runs borrow it (like
``RAY_ADDRESS``) and serving deploys onto it, so endpoints outlive their workflow.
``down`` ends exactly those processes (each node's whole session) and removes the file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import time
from typing import Any

from michelangelo.uniflow.plugins.ray._task import RayTask

STATE_ENV = "MA_CLUSTER_FILE"
_STOP_GRACE_S = 10.0


def state_file() -> str:
    """Where the standing cluster's description lives."""
    return os.environ.get(STATE_ENV) or os.path.join(
        os.path.expanduser("~"), ".michelangelo", "cluster.json")


@dataclasses.dataclass(frozen=True)
class StandingCluster:
    """What ``cluster up`` recorded: address, dashboard, shape and the node processes."""

    address: str
    dashboard_url: str | None
    node_pids: list[int]
    temp_dir: str
    log_dir: str
    task: dict[str, Any]
    auth_mode: str
    started_at: float

    def ray_task(self) -> RayTask:
        return RayTask(**self.task)

    def alive(self) -> bool:
        """Whether the head process still runs (the cluster is gone without it)."""
        return bool(self.node_pids) and _pid_alive(self.node_pids[0])


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    import psutil

    with contextlib.suppress(psutil.Error):
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    return False


def _is_ray_node(pid: int) -> bool:
    import psutil

    try:
        cmdline = psutil.Process(pid).cmdline()
    except psutil.Error:
        return False
    return any(part.endswith("ray") for part in cmdline[:2]) and "start" in cmdline


def read() -> StandingCluster | None:
    """The recorded cluster, alive or not; None when no file exists."""
    path = state_file()
    try:
        with open(path) as handle:
            data = json.load(handle)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return None
    fields = {f.name for f in dataclasses.fields(StandingCluster)}
    return StandingCluster(**{k: v for k, v in data.items() if k in fields})


def find() -> StandingCluster | None:
    """The standing cluster if one is up now, else None."""
    cluster = read()
    return cluster if cluster is not None and cluster.alive() else None


def use_auth_of(cluster: StandingCluster) -> None:
    """Make this process speak the cluster's auth mode (read by Ray when it connects)."""
    os.environ.setdefault("RAY_AUTH_MODE", cluster.auth_mode)


def up(task: RayTask, log_dir: str | None = None, node_wait_s: float = 180.0) -> StandingCluster:
    """Start a standing cluster shaped like ``task`` and record it.

    Raises:
        ClusterError: One is already up (named by the state file), or a node failed.
    """
    import ray

    from michelangelo.uniflow.core.errors import ClusterError
    from michelangelo.uniflow.plugins.ray._clusters._local import LocalRayCluster

    existing = find()
    if existing is not None:
        raise ClusterError(
            f"a cluster is already up at {existing.address} (recorded in {state_file()}). "
            "Fix: use it, or run `michelangelo cluster down` first.")
    log_dir = log_dir or os.path.join(os.path.dirname(state_file()), "cluster-logs")
    cluster = LocalRayCluster(task, log_dir)
    cluster.start()
    try:
        cluster.wait_for_nodes(node_wait_s)
        cluster.wait_for_worker_starts(60)
    except BaseException:
        cluster.shutdown()
        raise
    ray.shutdown()  # disconnect only; the nodes keep running
    standing = StandingCluster(
        address=cluster.address,
        dashboard_url=cluster.dashboard_url,
        node_pids=cluster.node_pids,
        temp_dir=cluster.temp_dir,
        log_dir=log_dir,
        task={f.name: getattr(task, f.name) for f in dataclasses.fields(task) if f.init},
        auth_mode=cluster.auth_mode,
        started_at=time.time(),
    )
    path = state_file()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    staging = f"{path}.tmp-{os.getpid()}"
    with open(staging, "w") as handle:
        json.dump(dataclasses.asdict(standing), handle, indent=2)
    os.replace(staging, path)  # runs never see a half-written file
    return standing


def down() -> StandingCluster | None:
    """Stop the recorded cluster's processes (and only those); return what was stopped."""
    import shutil

    from michelangelo.uniflow.plugins.ray._clusters._local import _kill_sessions

    cluster = read()
    if cluster is None:
        return None
    # A long-gone cluster's pids may belong to someone else by now: only end `ray start` ones.
    pids = [pid for pid in cluster.node_pids if _is_ray_node(pid)]
    for pid in reversed(pids):  # workers first, then the head
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + _STOP_GRACE_S
    while time.monotonic() < deadline and any(_pid_alive(p) for p in pids):
        time.sleep(0.1)
    if pids:
        _kill_sessions(set(pids))
    shutil.rmtree(cluster.temp_dir, ignore_errors=True)
    with contextlib.suppress(FileNotFoundError):
        os.remove(state_file())
    return cluster
