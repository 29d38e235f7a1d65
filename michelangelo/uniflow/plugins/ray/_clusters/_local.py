"""A real multi-node Ray cluster on this machine, shaped like a ``RayTask``.

The head and each worker node are separate ``ray start --block`` processes on loopback
(the way KubeRay pods run them), with logical CPUs, GPUs, memory and disk taken from the
RayTask; oversubscribing the machine is fine because Ray schedules on logical resources.
The driver connects as soon as the head is up, and worker nodes join in the background:
Ray Train dispatch waits for them (bounded) through :meth:`wait_for_nodes`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from michelangelo.uniflow.core.errors import ClusterError
from michelangelo.uniflow.plugins.ray._clusters._cluster import ClusterState, RayCluster
from michelangelo.uniflow.plugins.ray._clusters._ports import free_port
from michelangelo.uniflow.plugins.ray._clusters._reaper import adopting_orphans
from michelangelo.uniflow.plugins.ray._task import RayTask, node_resources

_HEAD_START_TIMEOUT_S = 120.0
_NODE_START_TRIES = 3  # starts per node when Ray's registration time runs out
_REGISTRATION_TIMEOUT = "timed out during startup"  # what `ray start` says after its 30 s
_PREEMPTION_WATCHER_ENV = "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"  # Ray Train's switch, default on
_USAGE_STATS_ENV = "RAY_USAGE_STATS_ENABLED"  # what `ray start --disable-usage-stats` sets


def _ray_executable() -> str:
    candidate = os.path.join(os.path.dirname(sys.executable), "ray")
    return candidate if os.path.exists(candidate) else "ray"


def node_arguments(task: RayTask, role: str) -> list[str]:
    """``ray start`` resource flags for the head or a worker node of ``task``."""
    return node_resources(task, role).start_flags()


class LocalRayCluster(RayCluster):
    """Head and workers as local ``ray start`` processes, torn down with the run."""

    #: The ``ray`` command the nodes run (None: the one beside this Python, else PATH's).
    ray_command: str | None = None

    def __init__(self, task: RayTask, log_dir: str) -> None:
        self.task = task
        self.log_dir = log_dir
        self.transition(ClusterState.PENDING)
        self._procs: list[subprocess.Popen] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._joiner: threading.Thread | None = None
        self._logs: list[str] = []
        self._worker_tries: dict[int, int] = {}  # node index -> starts so far, when over 1
        self._env = dict(os.environ)
        # `ray start` turns token auth on in Ray 2.60, while this driver, as a client, follows
        # its own RAY_AUTH_MODE (read when ray is imported; "disabled" unless set). The nodes
        # follow the driver so that it can connect: set RAY_AUTH_MODE=token to have both on.
        self._env["RAY_AUTH_MODE"] = os.environ.get("RAY_AUTH_MODE", "disabled")
        # Ray Train starts a preemption watcher actor per training, which polls the nodes' drain
        # state for spot or Kubernetes node loss. Processes on this machine are not preempted,
        # and the watcher's process start takes CPU from the training workers' start.
        self._env.setdefault(_PREEMPTION_WATCHER_ENV, "0")

    @property
    def node_pids(self) -> list[int]:
        """Process ids of the ``ray start`` processes started so far, head first."""
        return [proc.pid for proc in self._procs]

    @property
    def temp_dir(self) -> str | None:
        """The cluster's private Ray temp dir (``None`` before :meth:`start`)."""
        return getattr(self, "_temp_dir", None)

    @property
    def auth_mode(self) -> str:
        """The ``RAY_AUTH_MODE`` the nodes run with (the driver must use the same)."""
        return self._env["RAY_AUTH_MODE"]

    def wait_for_worker_starts(self, timeout_s: float) -> None:
        """Wait until every worker's ``ray start`` has been launched (at most ``timeout_s``)."""
        if self._joiner is not None:
            self._joiner.join(timeout=timeout_s)

    def start(self) -> None:
        import ray

        if ray.is_initialized():
            raise ClusterError(
                "Ray is already initialised in this process, so uniflow cannot connect it to "
                "the RayTask's cluster. Call ray.shutdown() first, or set RAY_ADDRESS to run "
                "on that cluster instead."
            )
        os.makedirs(self.log_dir, exist_ok=True)
        # The nodes run with Ray's usage stats off (`--disable-usage-stats`), so nothing this
        # driver records for them is ever sent. The driver follows them while it is connected:
        # otherwise each Ray Data run here starts a usage collection actor and a thread that
        # polls for cluster metrics, for figures no one reads. Restored when the cluster stops.
        self._set_usage_stats = _USAGE_STATS_ENV not in os.environ
        if self._set_usage_stats:
            os.environ[_USAGE_STATS_ENV] = "0"
        try:
            dashboard_port = self._start_head()
            ray.init(
                address=self.address,
                runtime_env=self.task.runtime_env,
                log_to_driver=True,
                logging_level="WARNING",
            )
            self.dashboard_url = f"http://127.0.0.1:{dashboard_port}"
            self._joiner = threading.Thread(target=self._start_workers, daemon=True,
                                            name="uniflow-ray-workers")
            self._joiner.start()
        except BaseException:
            self.transition(ClusterState.FAILED)
            self.shutdown()
            raise
        self.transition(ClusterState.READY)

    def _start_head(self) -> int:
        """Start the head node; returns its dashboard port.

        Ray gives a starting node a fixed 30 s to register with its GCS and exits when that
        runs out, which a busy machine can exceed: such a head is started again, from a
        fresh temp dir and ports, up to ``_NODE_START_TRIES`` times. Any other exit fails.
        """
        from ray._private.services import get_node_ip_address

        for attempt in range(1, _NODE_START_TRIES + 1):
            port = free_port()
            dashboard_port = free_port()
            # A private temp dir keeps `ray start` from making this cluster the machine's
            # default (a plain ray.init() elsewhere would otherwise try to join it, even after
            # it is gone).
            self._temp_dir = tempfile.mkdtemp(prefix="uf-ray-", dir="/tmp")
            head = [
                "--head",
                f"--port={port}",
                f"--temp-dir={self._temp_dir}",
                f"--dashboard-port={dashboard_port}",
                "--dashboard-host=127.0.0.1",
                f"--dashboard-agent-listen-port={free_port()}",
                f"--ray-client-server-port={free_port()}",
                f"--metrics-export-port={free_port()}",
                *node_arguments(self.task, "head"),
            ]
            self.address = f"{get_node_ip_address()}:{port}"
            # Processes inside the cluster (e.g. Ray Train's placement-group cleaner) call
            # ray.init() without an address; with several Ray instances on one host they must
            # be told which one is theirs.
            self._env["RAY_ADDRESS"] = self.address
            self._spawn("head", head)
            try:
                self._wait_for_head(port)
                return dashboard_port
            except _HeadRegistrationTimedOut:
                if attempt == _NODE_START_TRIES:
                    raise
                self._discard_head()
        raise AssertionError("unreachable")

    def _discard_head(self) -> None:
        """End a head that gave up starting, with everything in its session and temp dir."""
        self._logs.pop()
        _end_node(self._procs.pop())
        shutil.rmtree(self._temp_dir, ignore_errors=True)

    def _start_workers(self) -> None:
        """Start worker nodes one after another, in the background.

        Nodes that start at the same moment on one host pick the same socket file names
        (Ray numbers them by looking at what exists), so each waits for the previous one's
        sockets to appear; the task body does not wait for any of this.
        """
        sockets = os.path.join(self._temp_dir, "session_latest", "sockets")
        for index in range(self.task.worker_instances):
            if self._stopping.is_set():
                return
            before = _count_sockets(sockets)
            with self._lock:
                if self._stopping.is_set():
                    return
                self._spawn(f"worker-{index}", self._worker_args())
            proc = self._procs[-1]
            deadline = time.monotonic() + 60
            while (_count_sockets(sockets) <= before and proc.poll() is None
                   and time.monotonic() < deadline and not self._stopping.is_set()):
                time.sleep(0.1)

    def _worker_args(self) -> list[str]:
        return [
            f"--address={self.address}",
            f"--dashboard-agent-listen-port={free_port()}",
            f"--metrics-export-port={free_port()}",
            # Every node of this cluster shares one host and one log folder: the head's log
            # monitor already forwards each line, once.
            "--include-log-monitor=False",
            *node_arguments(self.task, "worker"),
        ]

    def _restart_worker(self, index: int) -> bool:
        """Start node ``index`` (a worker) again if it exited because Ray's fixed 30 s for a
        node to register with its GCS ran out, as on a busy machine; at most
        ``_NODE_START_TRIES`` starts per worker. False when that does not apply.

        While other workers are still being started the restart waits for them (nodes that
        start at the same moment on one host pick the same socket names).
        """
        proc = self._procs[index]
        tries = self._worker_tries.get(index, 1)
        if (index == 0 or tries >= _NODE_START_TRIES
                or _REGISTRATION_TIMEOUT not in _tail(self._logs[index])):
            return False
        if self._joiner is not None and self._joiner.is_alive():
            return True  # restarted once the joiner is done
        with self._lock:
            if self._stopping.is_set():
                return False
            _end_node(proc)
            self._worker_tries[index] = tries + 1
            self._spawn(f"worker-{index - 1}-start-{tries + 1}", self._worker_args(),
                        slot=index)
        return True

    def _spawn(self, name: str, args: list[str], slot: int | None = None) -> None:
        log = os.path.join(self.log_dir, f"{name}.log")
        with open(log, "wb") as handle:
            proc = subprocess.Popen(
                [self.ray_command or _ray_executable(), "start", "--block",
                 "--disable-usage-stats", *args],
                stdout=handle,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self._env,
                start_new_session=True,  # its own process group: we can end all of it
            )
        if slot is None:
            self._logs.append(log)
            self._procs.append(proc)
        else:
            self._logs[slot], self._procs[slot] = log, proc

    def _wait_for_head(self, port: int) -> None:
        import socket

        deadline = time.monotonic() + _HEAD_START_TIMEOUT_S
        while time.monotonic() < deadline:
            head = self._procs[0]
            if head.poll() is not None:
                error = (_HeadRegistrationTimedOut
                         if _REGISTRATION_TIMEOUT in _tail(self._logs[0]) else ClusterError)
                raise error(
                    f"the Ray head exited with code {head.returncode} while starting; "
                    f"its log ends with:\n{_tail(self._logs[0])}"
                )
            with socket.socket() as sock:
                sock.settimeout(0.2)
                if sock.connect_ex(("127.0.0.1", port)) == 0 and _head_started(self._logs[0]):
                    return
            time.sleep(0.1)
        raise ClusterError(
            f"the Ray head did not come up within {_HEAD_START_TIMEOUT_S:.0f}s; its log ends "
            f"with:\n{_tail(self._logs[0])}"
        )

    def wait_for_nodes(self, timeout_s: float,
                       enough: Callable[[], bool] | None = None) -> None:
        import ray

        expected = 1 + self.task.worker_instances
        deadline = time.monotonic() + timeout_s
        while True:
            for index, proc in enumerate(list(self._procs)):
                if proc.poll() is not None and not self._restart_worker(index):
                    raise ClusterError(
                        f"Ray node {index} of the RayTask cluster exited with code "
                        f"{proc.returncode}; its log ends with:\n{_tail(self._logs[index])}"
                    )
            alive = sum(1 for node in ray.nodes() if node.get("Alive"))
            if alive >= expected or (enough is not None and enough()):
                return
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"only {alive} of the {expected} Ray nodes declared by {self.task.describe()} "
                    f"joined within {timeout_s:.0f}s. The machine may be overloaded; raise "
                    "UF_RAY_NODE_WAIT_S to wait longer. Node logs are in " + self.log_dir
                )
            time.sleep(0.2)

    def collect_logs(self, destination: str) -> None:
        """Copy worker and Ray Train log files of this cluster's session into ``destination``.

        Ray Train V2 sends a worker's prints to its own log files rather than to the driver,
        so copying the files is what keeps a task's worker output with its run.
        """
        logs = os.path.join(getattr(self, "_temp_dir", ""), "session_latest", "logs")
        if not os.path.isdir(logs):
            return
        for root, _, files in os.walk(logs):
            for name in files:
                rel = os.path.relpath(os.path.join(root, name), logs)
                wanted = name.startswith("worker-") or rel.startswith("train")
                source = os.path.join(root, name)
                if not wanted or not name.endswith((".out", ".err", ".log")):
                    continue
                with contextlib.suppress(OSError):
                    if os.path.getsize(source) == 0:
                        continue
                    target = os.path.join(destination, rel)
                    os.makedirs(os.path.dirname(target), exist_ok=True)
                    shutil.copyfile(source, target)

    def shutdown(self) -> None:

        if self.state == ClusterState.DELETED:
            return
        self._stopping.set()
        with self._lock:  # no node may start while we stop the others
            self._stop_processes()

    def _stop_processes(self) -> None:
        import ray

        if ray.is_initialized():
            ray.shutdown()
        if getattr(self, "_set_usage_stats", False):
            os.environ.pop(_USAGE_STATS_ENV, None)
            self._set_usage_stats = False
        # SIGKILL at once, workers first. The cluster is this run's alone and the driver has
        # disconnected: no node keeps anything the run needs (its logs are copied as each
        # task ends, its temp dir goes next), and there is no other node to drain to. A
        # SIGTERM first only made the run wait: the head takes 3.5 s to stop its processes
        # one by one. Ray worker processes put themselves in their own process groups but
        # stay in their node's session, so everything in each node's session is ended.
        # Their orphans are this process's to reap meanwhile, rather than PID 1's (_reaper).
        with adopting_orphans():
            for proc in reversed(self._procs):
                _signal_group(proc, signal.SIGKILL)
            for proc in reversed(self._procs):
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=5)
            _kill_sessions({proc.pid for proc in self._procs})
        self._procs.clear()
        if getattr(self, "_temp_dir", None):
            shutil.rmtree(self._temp_dir, ignore_errors=True)
        self.transition(ClusterState.DELETED)


class _HeadRegistrationTimedOut(ClusterError):
    """The head exited because it did not register with its GCS within Ray's 30 s."""


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def _end_node(proc: subprocess.Popen) -> None:
    """End a node that gave up starting, with everything left in its session."""
    _signal_group(proc, signal.SIGKILL)
    _kill_sessions({proc.pid})
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


def _kill_sessions(sessions: set[int]) -> None:
    import psutil

    for _ in range(3):
        left = []
        for proc in psutil.process_iter():
            with contextlib.suppress(psutil.Error, ProcessLookupError, PermissionError):
                if os.getsid(proc.pid) in sessions and proc.pid != os.getpid():
                    proc.kill()
                    left.append(proc)
        if not left:
            return
        _wait_gone(left, timeout_s=5.0)


def _wait_gone(procs: list[Any], timeout_s: float) -> None:
    """Wait until every one of ``procs`` (``psutil.Process``) is gone, at most ``timeout_s``.

    Gone means reaped: this process reaps its own children here; the others are reaped by
    their parent, often PID 1 once the node that started them has ended. All are checked
    together every 20 ms; psutil's ``wait_procs`` checks one at a time, which took 2 s for
    the 26 processes of the quickstart's cluster where reaping takes 0.1 to 1.1 s.
    """
    deadline = time.monotonic() + timeout_s
    while procs and time.monotonic() < deadline:
        time.sleep(0.02)
        procs = [proc for proc in procs if not _gone(proc)]


def _gone(proc: Any) -> bool:
    import psutil

    try:
        proc.wait(timeout=0)  # reaps a child of this process; polls any other
    except psutil.TimeoutExpired:
        return False
    except psutil.Error:
        return True
    return True


def _count_sockets(folder: str) -> int:
    try:
        return sum(1 for name in os.listdir(folder) if name.startswith("plasma_store"))
    except OSError:
        return 0


def _head_started(log: str) -> bool:
    try:
        with open(log, "rb") as handle:
            return b"Ray runtime started" in handle.read()
    except OSError:
        return False


def _tail(path: str, lines: int = 15) -> str:
    try:
        with open(path, errors="replace") as handle:
            return "".join(handle.readlines()[-lines:])
    except OSError:
        return "(no log)"
