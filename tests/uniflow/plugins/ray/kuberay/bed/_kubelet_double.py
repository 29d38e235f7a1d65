"""TEST DOUBLE of the kubelet, at its boundary: pods bound to its Node objects in, local
processes and pod status out, through the real API server.

No kubelet or container runtime can run here. For each pod the real scheduler bound to one of
its nodes, the double gives the pod its own loopback address (127.A.B.N stands in for pod
networking; A.B is drawn per double, so two test beds on one machine do not share
addresses), runs the pod's ``ray start`` command as a local process on that address (the
container image is not run; only the Ray image at this client's Ray version "exists", any
other image fails to pull as ``ImagePullBackOff``), and reports the status a kubelet would:
``Running`` with ``podIP`` and ``Ready`` once Ray is up; a process that dies is restarted with
a growing back-off and reported as ``CrashLoopBackOff`` meanwhile (restartPolicy Always). A
worker pod stays in its init phase until its head's Ray is up, as KubeRay's ``wait-gcs-ready``
init container keeps it. A pod marked for deletion has its processes stopped and is removed.
Port-forward streams the API server proxies to the node are served by
``_kubelet_streaming_double``.
"""

from __future__ import annotations

import contextlib
import os
import random
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client

# A pod's processes are ended, and its start is seen, the way the local provisioner does it.
from michelangelo.uniflow.plugins.ray._local import _head_started, _kill_sessions
from michelangelo.uniflow.plugins.ray._ports import free_port
from tests.uniflow.plugins.ray.kuberay.bed._kubelet_streaming_double import KubeletStreamingDouble

_HEAD_GCS_PORT = 6379
_DASHBOARD_PORT = 8265


def _free_port(ip: str) -> int:
    return free_port(host=ip)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass
class _PodProcess:
    name: str
    ip: str
    proc: subprocess.Popen | None
    log: str
    temp_dir: str
    head: bool
    gcs_port: int | None = None
    words: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    restarts: int = 0
    restart_at: float = 0.0
    reported: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


class KubeletDouble:
    def __init__(self, api_client: Any, nodes: list[str], *, namespace: str = "default",
                 good_image_prefix: str | None = None, first_ip: int = 40) -> None:
        import ray

        self.nodes = set(nodes)
        self.namespace = namespace
        self.good_image_prefix = good_image_prefix or f"rayproject/ray:{ray.__version__}"
        self._core = client.CoreV1Api(api_client)
        self._next_ip = first_ip
        # A loopback /24 of this double's own: Ray's fixed ports (6379, 8265, ...) on a pod
        # address would otherwise meet a second bed's pods when two suites share the machine.
        self._subnet = f"127.{random.randint(1, 254)}.{random.randint(0, 255)}"
        self._pods: dict[str, _PodProcess] = {}
        self._heads: dict[str, tuple[str, int]] = {}  # cluster -> (ip, gcs port)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="kubelet-double")
        self.log_dir = tempfile.mkdtemp(prefix="uf-kubelet-")
        self.errors: list[str] = []

    def start(self) -> KubeletDouble:
        self.streaming = KubeletStreamingDouble(self._pod_ip).start()
        # What a kubelet reports of itself: where the API server reaches its streaming server.
        for node in self.nodes:
            self._core.patch_node_status(node, {"status": {
                "addresses": [{"type": "InternalIP", "address": "127.0.0.1"},
                              {"type": "Hostname", "address": "127.0.0.1"}],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": self.streaming.port}}}})
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.streaming.stop()
        for pod in list(self._pods.values()):
            self._kill(pod)
        self._pods.clear()

    def _pod_ip(self, namespace: str, name: str) -> str | None:
        record = self._pods.get(name) if namespace == self.namespace else None
        return record.ip if record is not None and record.proc is not None else None

    def processes(self) -> list[subprocess.Popen]:
        return [p.proc for p in self._pods.values() if p.proc is not None]

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.sync()
            except Exception as exc:
                self.errors.append(f"{type(exc).__name__}: {exc}"[:2000])
            self._stop.wait(0.3)

    # -- one pass ----------------------------------------------------------------------------
    def sync(self) -> None:
        pods = [p for p in self._core.list_namespaced_pod(self.namespace).items
                if p.spec.node_name in self.nodes]
        live = {p.metadata.name for p in pods}
        for name in list(self._pods):
            if name not in live:  # removed behind our back (force delete): stop it
                self._kill(self._pods.pop(name))
        for pod in pods:
            name = pod.metadata.name
            if pod.metadata.deletion_timestamp:
                if name in self._pods:
                    self._kill(self._pods.pop(name))
                with contextlib.suppress(client.ApiException):
                    self._core.delete_namespaced_pod(name, self.namespace,
                                                     grace_period_seconds=0)
                continue
            if name not in self._pods:
                if not self._head_up_for(pod):
                    self._report_init(pod)
                    continue
                self._pods[name] = self._run(pod)
            self._report(pod, self._pods[name])

    def _head_up_for(self, pod: Any) -> bool:
        labels = pod.metadata.labels or {}
        if labels.get("ray.io/node-type") == "head":
            return True
        cluster = labels.get("ray.io/cluster", "")
        heads = [p for p in self._pods.values() if p.head and self._heads.get(cluster, ("",))[0]
                 == p.ip]
        return bool(heads) and _head_started(heads[0].log)

    def _report_init(self, pod: Any) -> None:
        if pod.status.phase == "Pending" and any(
                c.type == "Initialized" and c.status == "False"
                for c in (pod.status.conditions or [])):
            return
        self._core.patch_namespaced_pod_status(pod.metadata.name, self.namespace, {"status": {
            "phase": "Pending",
            "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": _now()},
                {"type": "Initialized", "status": "False", "reason": "ContainersNotInitialized",
                 "message": "containers with incomplete status: [wait-gcs-ready]",
                 "lastTransitionTime": _now()}]}})

    def _run(self, pod: Any) -> _PodProcess:
        container = pod.spec.containers[0]
        ip = f"{self._subnet}.{self._next_ip}"
        self._next_ip += 1
        labels = pod.metadata.labels or {}
        head = labels.get("ray.io/node-type") == "head"
        temp_dir = tempfile.mkdtemp(prefix="r", dir="/tmp")
        log = os.path.join(self.log_dir, f"{pod.metadata.name}.log")
        record = _PodProcess(pod.metadata.name, ip, None, log, temp_dir, head)
        if not container.image.startswith(self.good_image_prefix):
            record.extra["image_error"] = (
                f'Failed to pull image "{container.image}": not found in any registry')
            return record
        record.words = self._command(pod, record, labels.get("ray.io/cluster", ""))
        env = dict(os.environ)
        env.update({"RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled"),
                    "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",
                    "RAY_USAGE_STATS_ENABLED": "0"})
        env.pop("RAY_ADDRESS", None)
        # The Ray image's `python` is the one with Ray and this project: here, this venv's.
        env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
        for item in container.env or []:
            env[item.name] = item.value or ""
        record.env = env
        self._start(record)
        return record

    def _start(self, record: _PodProcess) -> None:
        with open(record.log, "ab") as handle:
            record.proc = subprocess.Popen(record.words, stdout=handle,
                                           stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                           env=record.env, start_new_session=True)

    def _command(self, pod: Any, record: _PodProcess, cluster: str) -> list[str]:
        script = pod.spec.containers[0].args[0].split(";", 1)[-1].strip()
        words = shlex.split(script)
        assert words[:2] == ["ray", "start"], words
        ray_bin = os.path.join(os.path.dirname(sys.executable), "ray")
        out = [ray_bin, "start"]
        for word in words[2:]:
            if word.startswith("--address="):
                head_ip, gcs = self._heads[cluster]
                word = f"--address={head_ip}:{gcs}"
            elif word.startswith("--dashboard-host="):
                word = f"--dashboard-host={record.ip}"
            out.append(word)
        # What a pod's own network namespace would give it: its address and private ports.
        out += [f"--node-ip-address={record.ip}", f"--temp-dir={record.temp_dir}",
                f"--dashboard-agent-listen-port={_free_port(record.ip)}",
                f"--metrics-export-port={_free_port(record.ip)}",
                f"--node-manager-port={_free_port(record.ip)}",
                f"--object-manager-port={_free_port(record.ip)}",
                "--disable-usage-stats"]
        if record.head:
            record.gcs_port = _free_port(record.ip)
            self._heads[cluster] = (record.ip, record.gcs_port)
            out += [f"--port={record.gcs_port}", f"--dashboard-port={_DASHBOARD_PORT}",
                    f"--ray-client-server-port={_free_port(record.ip)}"]
        return out

    def _report(self, pod: Any, record: _PodProcess) -> None:
        container = pod.spec.containers[0]
        if "image_error" in record.extra:
            state = {"waiting": {"reason": "ImagePullBackOff",
                                 "message": record.extra["image_error"]}}
            self._patch(pod, record, "Pending", False, state, "image")
            return
        proc = record.proc
        assert proc is not None
        if proc.poll() is not None:
            now = time.monotonic()
            if not record.restart_at:
                _kill_sessions({proc.pid})
                record.restarts += 1
                record.restart_at = now + min(5.0 * 2 ** (record.restarts - 1), 60.0)
            elif now >= record.restart_at:
                record.restart_at = 0.0
                self._start(record)
                return
            state = {"waiting": {"reason": "CrashLoopBackOff", "message":
                                 f"back-off restarting failed container {container.name}"}}
            self._patch(pod, record, "Running", False, state, f"crash{record.restarts}",
                        last={"terminated": {"exitCode": proc.returncode, "reason": "Error",
                                             "finishedAt": _now(), "startedAt": _now()}},
                        restarts=record.restarts)
            return
        ready = _head_started(record.log)
        state = {"running": {"startedAt": _now()}}
        self._patch(pod, record, "Running", ready, state, f"running{ready}{record.restarts}",
                    restarts=record.restarts)

    def _patch(self, pod: Any, record: _PodProcess, phase: str, ready: bool,
               state: dict[str, Any], key: str, last: dict[str, Any] | None = None,
               restarts: int = 0) -> None:
        if record.reported == key:
            return
        container = pod.spec.containers[0]
        flag = "True" if ready else "False"
        status = {
            "phase": phase, "podIP": record.ip, "hostIP": "127.0.0.1", "startTime": _now(),
            "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": _now()},
                {"type": "Initialized", "status": "True", "lastTransitionTime": _now()},
                {"type": "ContainersReady", "status": flag, "lastTransitionTime": _now()},
                {"type": "Ready", "status": flag, "lastTransitionTime": _now()},
            ],
            "containerStatuses": [{
                "name": container.name, "image": container.image, "imageID": "",
                "ready": ready, "restartCount": restarts, "state": state,
                **({"lastState": last} if last else {})}],
        }
        self._core.patch_namespaced_pod_status(pod.metadata.name, self.namespace,
                                               {"status": status})
        record.reported = key

    def _kill(self, record: _PodProcess) -> None:
        if record.proc is not None and record.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(record.proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                record.proc.wait(timeout=10)
        if record.proc is not None:
            _kill_sessions({record.proc.pid})
        import shutil

        shutil.rmtree(record.temp_dir, ignore_errors=True)
