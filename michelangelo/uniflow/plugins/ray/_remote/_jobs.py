"""An existing Ray cluster reached through its Jobs API (the dashboard URL, port 8265).

Everything goes over HTTP with Ray's own ``JobSubmissionClient``, which also adds the
``Authorization`` header when ``RAY_AUTH_MODE=token`` (the token itself comes from
``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH`` or ``~/.ray/auth_token`` and is never printed).
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from michelangelo.uniflow.core.errors import ClusterError, TaskTimeoutError, UserError
from michelangelo.uniflow.plugins.ray._capacity import ClusterShape, NodeShape, check_holds
from michelangelo.uniflow.plugins.ray._task import RayTask

_TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")
_POLL_START_S = 0.05
_POLL_MAX_S = 0.5
_STOP_WAIT_S = 15.0


class JobFailedError(ClusterError):
    """A Ray job ended without the task's own result (it crashed, or was stopped)."""


class JobsCluster:
    """A Ray cluster at ``address`` (``http://HOST:8265``) that runs task attempts as jobs."""

    def __init__(self, address: str, *, headers: dict[str, str] | None = None) -> None:
        """Args:
            address: The dashboard URL.
            headers: Sent with every request, e.g. the cluster's token as ``Authorization``
                (a provisioner that made the cluster knows it; never printed).
        """
        from ray.job_submission import JobSubmissionClient

        self.address = address.rstrip("/")
        try:
            self.client = JobSubmissionClient(self.address, headers=headers)
        except ConnectionError as exc:
            raise ClusterError(
                f"--ray-address {self.address!r}: no Ray dashboard answers there ({exc}). "
                "Check the URL (the Jobs API is on the dashboard port, 8265 by default) and "
                "that the cluster is up."
            ) from None
        self._checked_shapes: list[RayTask] = []

    # -- checks before anything is submitted ------------------------------------------------
    def versions(self) -> dict[str, str]:
        """The cluster's Ray and Python versions, as its dashboard reports them."""
        ray_version = self._get("/api/version").get("ray_version", "unknown")
        meta = self._get("/api/v0/cluster_metadata").get("data", {})
        return {"ray": ray_version, "python": meta.get("pythonVersion", "unknown")}

    def check_versions(self) -> None:
        import ray

        compare_versions(
            {"ray": ray.__version__, "python": ".".join(map(str, sys.version_info[:3]))},
            self.versions(),
            self.address,
        )

    def probe(self, entrypoint: str, *, deadline_s: float = 300.0) -> str:
        """Run a short job with no runtime_env and return its output (for checks).

        Raises:
            ClusterError: The job did not succeed (with its status, message and output).
        """
        import uuid

        chunks: list[str] = []
        status, message = self.run_job(entrypoint=entrypoint, runtime_env={},
                                       submission_id=f"uniflow-probe-{uuid.uuid4().hex[:12]}",
                                       deadline_s=deadline_s, echo=chunks.append)
        output = "".join(chunks)
        if status != "SUCCEEDED":
            raise ClusterError(
                f"a check job on {self.address} ended {status}: {message.strip() or 'no message'}."
                f" Its output ends with:\n{output[-3000:] or '(nothing)'}")
        return output

    def live_shape(self) -> ClusterShape:
        """The cluster's alive nodes and their total logical resources."""
        data = self._get("/api/v0/nodes?detail=1&limit=10000")
        rows = data.get("data", {}).get("result", {}).get("result", [])
        nodes = []
        for row in rows:
            if row.get("state") != "ALIVE":
                continue
            name = ("head " if row.get("is_head_node") else "") + row.get("node_id", "?")[:8]
            resources = {k: float(v) for k, v in (row.get("resources_total") or {}).items()}
            nodes.append(NodeShape(name, resources))
        return ClusterShape.from_nodes(tuple(nodes), f"the cluster at {self.address}")

    def check_capacity(self, task: RayTask) -> None:
        """Raise ``CapacityError`` unless the live cluster can hold ``task``'s nodes."""
        if any(task == seen for seen in self._checked_shapes):
            return
        check_holds(
            task, self.live_shape(), where=f"--ray-address {self.address!r}",
            fix="shrink the RayTask to the cluster's nodes, or add nodes to the cluster",
        )
        self._checked_shapes.append(task)

    # -- one job ----------------------------------------------------------------------------
    def run_job(self, *, entrypoint: str, runtime_env: dict, submission_id: str,
                deadline_s: float | None = None,
                echo: Callable[[str], None] = print,
                setup_gate: threading.Lock | None = None,
                on_started: Callable[[], None] = lambda: None) -> tuple[str, str]:
        """Submit, stream the job's output to ``echo`` while it runs, return its status.

        Ctrl-C, SIGTERM or the deadline stop the job before returning (or raising).
        ``setup_gate``, when given, is held from submission until the job has left
        ``PENDING``: jobs sharing a ``working_dir`` must not set it up at the same time
        (Ray's runtime-env agent unpacks a package it has not finished caching again, with
        ``overwrite``, deleting the folder the first job already runs in).

        ``on_started`` is called once, when the job leaves ``PENDING``.

        Returns:
            ``(status, message)`` of the ended job.
        """
        with _sigterm_as_interrupt():
            gate = _HeldUntilStarted(setup_gate, on_started)
            try:
                job_id = self.client.submit_job(entrypoint=entrypoint, runtime_env=runtime_env,
                                                submission_id=submission_id)
                try:
                    return self._follow(job_id, deadline_s, echo, gate.release)
                except BaseException:
                    self.stop(job_id)
                    raise
            finally:
                gate.release()

    def _follow(self, job_id: str, deadline_s: float | None,
                echo: Callable[[str], None],
                on_started: Callable[[], None] = lambda: None) -> tuple[str, str]:
        started = time.monotonic()
        shown = 0
        poll = _POLL_START_S
        while True:
            info = self.client.get_job_info(job_id)
            status = str(getattr(info.status, "value", info.status))
            if status != "PENDING":
                on_started()
            shown = self._echo_new(job_id, shown, echo)
            if status in _TERMINAL:
                self._echo_new(job_id, shown, echo)
                return status, info.message or ""
            if deadline_s is not None and time.monotonic() - started > deadline_s:
                raise TaskTimeoutError(
                    f"Ray job {job_id} was still {status} after {deadline_s:g}s (the task's "
                    "timeout plus UF_RAY_JOB_START_GRACE_S for the job to start); stopped it."
                )
            time.sleep(poll)
            poll = min(poll * 1.5, _POLL_MAX_S)

    def _echo_new(self, job_id: str, shown: int, echo: Callable[[str], None]) -> int:
        logs = self.client.get_job_logs(job_id)
        if len(logs) > shown:
            echo(logs[shown:])
        return max(shown, len(logs))

    def stop(self, job_id: str) -> None:
        """Stop a job and wait (bounded) until the cluster says it ended."""
        with contextlib.suppress(Exception):
            self.client.stop_job(job_id)
            deadline = time.monotonic() + _STOP_WAIT_S
            while time.monotonic() < deadline:
                status = str(getattr(self.client.get_job_status(job_id), "value", ""))
                if status in _TERMINAL:
                    return
                time.sleep(0.2)

    def logs_tail(self, job_id: str, lines: int = 30) -> str:
        with contextlib.suppress(Exception):
            return "".join(self.client.get_job_logs(job_id).splitlines(True)[-lines:])
        return "(no logs)"

    def _get(self, endpoint: str) -> dict[str, Any]:
        response = self.client._do_request("GET", endpoint)
        if response.status_code != 200:
            raise ClusterError(
                f"the Ray dashboard at {self.address} answered {response.status_code} to "
                f"GET {endpoint.split('?')[0]}: {response.text[:300]}"
            )
        return response.json()


def compare_versions(client: dict[str, str], cluster: dict[str, str], address: str) -> None:
    """Raise ``UserError`` naming both sides when Ray or Python (major.minor) differ."""
    same_ray = client["ray"] == cluster["ray"]
    same_python = client["python"].split(".")[:2] == cluster["python"].split(".")[:2]
    if same_ray and same_python:
        return
    raise UserError(
        f"version mismatch: this machine runs Ray {client['ray']} on Python {client['python']}, "
        f"but the cluster at {address} runs Ray {cluster['ray']} on Python {cluster['python']}. "
        "Task code and results travel between the two, so they must match: install "
        f"ray=={cluster['ray']} on a Python {'.'.join(cluster['python'].split('.')[:2])} here, "
        "or use a cluster image with this machine's versions."
    )


class _HeldUntilStarted:
    """A lock taken now and released once (when the job starts, or at the latest when it ends)."""

    def __init__(self, lock: threading.Lock | None,
                 on_release: Callable[[], None] = lambda: None) -> None:
        self._lock = lock
        self._on_release: Callable[[], None] | None = on_release
        # In short waits: a branch thread stopped by the run (an async KeyboardInterrupt)
        # must not sit in one uninterruptible acquire.
        while lock is not None and not lock.acquire(timeout=0.2):
            pass

    def release(self) -> None:
        lock, self._lock = self._lock, None
        if lock is not None:
            lock.release()
        hook, self._on_release = self._on_release, None
        if hook is not None:
            hook()


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """While a job runs, SIGTERM unwinds like Ctrl-C so that the job is stopped too."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.getsignal(signal.SIGTERM)
    if previous not in (signal.SIG_DFL, None):
        yield  # someone (the michelangelo CLI) already turns SIGTERM into an unwind
        return
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
