"""TEST DOUBLE of the kubelet, at its boundary: pods bound to its Node objects in, local
processes and pod status out, through the real API server.

No kubelet or container runtime can run here. For each pod the real scheduler bound to one of
its nodes, the double gives the pod an address of its own on the loopback device
(198.18.A.N stands in for pod networking, see ``_pod_network_double``) and runs the pod's
containers the way a kubelet orders them: the init containers one after another (KubeRay's ``wait-gcs-ready`` loop
included), each to success, then the first (Ray) container, all through ``bash`` with the
container's ``command``/``args`` and its environment (``env`` with ``value`` and ``valueFrom``
(Secret, ConfigMap, pod fields), ``envFrom``). A Secret or ConfigMap that is missing and not
optional leaves the container waiting with ``CreateContainerConfigError``, as a kubelet does.
The container image is not run; only the Ray image at this client's Ray version "exists", any
other image fails to pull (``ErrImagePull`` at each try, ``ImagePullBackOff`` between tries).
``Ready`` follows the container's readiness probe (``httpGet``, or the operator's ``wget`` exec
probe read as its URLs), evaluated on the probe's own delay and period. A process that ends is
started again (restartPolicy Always): at once the first time, then after 10 s, 20 s, 40 s ...
up to 300 s; between starts its status shows the run that ended, as ``terminated``. The
statuses (conditions and their order, transition times, ``started``, ``lastState``,
``restartCount``) take the shapes a real 1.36 kubelet writes, recorded from the kind sandbox
in ``tests/uniflow/plugins/ray/kuberay/real_kubelet_pods.json``. A pod marked for deletion
has its processes stopped and is removed. Port-forward streams the API server proxies to the
node are served by ``_kubelet_streaming_double``.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client

from michelangelo.uniflow.plugins.ray.provisioning import free_port
from tools.kuberay_bed._kubelet_streaming_double import KubeletStreamingDouble
from tools.kuberay_bed._pod_network_double import (
    VIRTUAL_PORTS,
    add_pod_address,
    pod_subnet,
    remove_pod_address,
    write_wrapper,
)

_DASHBOARD_PORT = 8265


def _free_port(ip: str) -> int:
    return free_port(host=ip)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class _ConfigError(Exception):
    """What a kubelet reports as CreateContainerConfigError."""


@dataclass
class PodRecord:
    """What the double knows of one pod it runs."""

    name: str
    ip: str
    proc: subprocess.Popen | None
    log: str
    temp_dir: str
    head: bool
    labels: dict[str, str] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    init_index: int = 0  # init containers done
    restart_at: float = 0.0  # the current container starts (again) from then on
    reported: str = ""  # the status last written
    ready: bool = False
    probe_at: float = 0.0
    started_at: float = 0.0
    start_time: str = field(default_factory=_now)  # the pod's startTime, set once
    admitted: float = field(default_factory=time.monotonic)
    # Each container's runs, oldest first: containerID, startedAt, and once it ended
    # finishedAt, exitCode and reason. restartCount is one less than the runs.
    runs: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    waiting: dict[str, str] | None = None  # why the current container cannot be created
    transitions: dict[str, tuple[str, str]] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


class KubeletDouble:
    def __init__(self, api_client: Any, nodes: list[str], *, namespace: str = "default",
                 good_image_prefix: str | None = None, first_ip: int = 40,
                 net_file: Path | None = None) -> None:
        import ray

        self.nodes = set(nodes)
        self.namespace = namespace
        self.good_image_prefix = good_image_prefix or f"rayproject/ray:{ray.__version__}"
        self._core = client.CoreV1Api(api_client)
        self._next_ip = first_ip
        # Pod IPs in a /24 of this double's own (see _pod_network_double.pod_subnet).
        self._subnet = pod_subnet()
        self._pods: dict[str, PodRecord] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="kubelet-double")
        self.log_dir = tempfile.mkdtemp(prefix="uf-kubelet-")
        self._bin = Path(self.log_dir) / "bin"
        write_wrapper(self._bin)
        self._net_file = net_file or Path(self.log_dir) / "net.json"
        self._net_file.write_text("{}")
        self.errors: list[str] = []

    def start(self) -> KubeletDouble:
        self.streaming = KubeletStreamingDouble(self._pod_ip, self._container_log).start()
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
        shutil.rmtree(self.log_dir, ignore_errors=True)  # the pods' logs, the wrapper

    def _container_log(self, namespace: str, name: str, container: str,
                       previous: bool) -> str:
        """One run's output of ``container``: the current or last one, or with ``previous``
        the one before a restart (see the streaming double for the kubelet's rules)."""
        record = self._pods.get(name) if namespace == self.namespace else None
        if record is None:
            raise LookupError(f"pod {namespace}/{name} is not on this kubelet")
        runs: list[tuple[str, list[str]]] = []
        with open(record.log, errors="replace") as handle:
            for line in handle:
                if line.startswith("--- "):
                    runs.append((line[4:].rstrip("\n"), []))
                elif runs:
                    runs[-1][1].append(line)
        mine = [lines for who, lines in runs if who == container]
        if not mine:
            raise LookupError(f"container {container!r} in pod {name!r} is not available")
        # As a kubelet: the current container is the latest run, running or ended (the
        # status's state), and the previous one is the run before it (its lastState).
        if previous:
            if len(mine) < 2:
                raise ValueError(f"previous terminated container {container!r} in pod "
                                 f"{name!r} not found")
            return "".join(mine[-2])
        return "".join(mine[-1])

    def _pod_ip(self, namespace: str, name: str) -> str | None:
        record = self._pods.get(name) if namespace == self.namespace else None
        return record.ip if record is not None and record.proc is not None else None

    def pod_log(self, name: str) -> str:
        """What the pod's containers printed, each after a ``--- <container>`` line."""
        record = self._pods.get(name)
        if record is None:
            return ""
        with open(record.log, errors="replace") as handle:
            return handle.read()

    def processes(self) -> list[subprocess.Popen]:
        return [p.proc for p in self._pods.values() if p.proc is not None]

    def stray_processes(self) -> list[int]:
        """Processes of this double's pods that are no longer running pods (there should be
        none: a container's end takes everything started in it)."""
        live = {p.ip for p in self._pods.values()}
        return [pid for pid, ip in _pod_processes(self._subnet) if ip not in live]

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
                self._pods[name] = self._admit(pod)
        self._write_network()
        for pod in pods:
            record = self._pods.get(pod.metadata.name)
            if record is not None and not pod.metadata.deletion_timestamp:
                self._step(pod, record)

    def _admit(self, pod: Any) -> PodRecord:
        ip = f"{self._subnet}.{self._next_ip}"
        self._next_ip += 1
        add_pod_address(ip)
        labels = dict(pod.metadata.labels or {})
        head = labels.get("ray.io/node-type") == "head"
        temp_dir = tempfile.mkdtemp(prefix="r", dir="/tmp")
        log = os.path.join(self.log_dir, f"{pod.metadata.name}.log")
        record = PodRecord(pod.metadata.name, ip, None, log, temp_dir, head, labels)
        record.ports = {str(v): _free_port(ip) for v in VIRTUAL_PORTS.values()}
        record.ports[str(_DASHBOARD_PORT)] = _DASHBOARD_PORT  # the dashboard keeps its port
        bad = [c.image for c in [*(pod.spec.init_containers or []), *pod.spec.containers]
               if not c.image.startswith(self.good_image_prefix)]
        if bad:
            record.extra["image_error"] = bad[0]
        return record

    def _write_network(self) -> None:
        """Cluster DNS for the pods: pod IPs and Service names to pod addresses and ports."""
        hosts: dict[str, Any] = {}
        for record in self._pods.values():
            hosts[record.ip] = {"ip": record.ip, "ports": record.ports}
        for svc in self._core.list_namespaced_service(self.namespace).items:
            selector = svc.spec.selector or {}
            if not selector:
                continue
            for record in self._pods.values():
                if record.proc is not None and all(record.labels.get(k) == v
                                                    for k, v in selector.items()):
                    name = svc.metadata.name
                    for host in (name, f"{name}.{self.namespace}",
                                 f"{name}.{self.namespace}.svc",
                                 f"{name}.{self.namespace}.svc.cluster.local"):
                        hosts[host] = hosts[record.ip]
                    break
        text = json.dumps({"hosts": hosts})
        if self._net_file.read_text() != text:
            tmp = self._net_file.with_suffix(".tmp")
            tmp.write_text(text)
            tmp.replace(self._net_file)

    # -- the container environment -------------------------------------------------------------
    def _secret(self, name: str) -> dict[str, str] | None:
        try:
            secret = self._core.read_namespaced_secret(name, self.namespace)
        except client.ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return {k: base64.b64decode(v).decode() for k, v in (secret.data or {}).items()}

    def _config_map(self, name: str) -> dict[str, str] | None:
        try:
            return dict(self._core.read_namespaced_config_map(name, self.namespace).data or {})
        except client.ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def _environment(self, pod: Any, record: PodRecord, container: Any) -> dict[str, str]:
        # The Ray image's environment is this machine's, less what points at other clusters
        # or decides Ray's auth (only the pod's own env may); its `python` is this venv's.
        env = {k: v for k, v in os.environ.items()
               if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "KUBECONFIG")}
        env["PATH"] = os.pathsep.join([str(self._bin), os.path.dirname(sys.executable),
                                       env.get("PATH", "/usr/bin:/bin")])
        env["PYTHONPATH"] = os.pathsep.join(
            [str(self._bin / "site"), *filter(None, [env.get("PYTHONPATH")])])
        # A pod's own file system: no Ray token or other state of this machine's user.
        home = os.path.join(record.temp_dir, "home")
        os.makedirs(home, exist_ok=True)
        env.update({"HOME": home, "HOSTNAME": pod.metadata.name, "RAY_USAGE_STATS_ENABLED": "0",
                    "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"})
        for source in container.env_from or []:
            prefix = source.prefix or ""
            if source.secret_ref is not None:
                data = self._secret(source.secret_ref.name)
                ref, kind = source.secret_ref, "secret"
            else:
                data = self._config_map(source.config_map_ref.name)
                ref, kind = source.config_map_ref, "configmap"
            if data is None:
                if ref.optional:
                    continue
                raise _ConfigError(f'{kind} "{ref.name}" not found')
            env.update({prefix + k: v for k, v in data.items()})
        for item in container.env or []:
            if item.value_from is None:
                env[item.name] = _expand(item.value or "", env)
                continue
            value = self._value_from(pod, record, item.name, item.value_from)
            if value is not None:
                env[item.name] = value
        # What the pod network double needs to give this pod its network.
        env.update({"UF_POD_IP": record.ip, "UF_POD_PORTS": json.dumps(record.ports),
                    "UF_POD_TEMP": record.temp_dir, "UF_NET_FILE": str(self._net_file),
                    "UF_REAL_RAY": os.path.join(os.path.dirname(sys.executable), "ray"),
                    "UF_POD_NODE_MANAGER_PORT": str(_free_port(record.ip)),
                    "UF_POD_OBJECT_MANAGER_PORT": str(_free_port(record.ip))})
        return env

    def _value_from(self, pod: Any, record: PodRecord, name: str, source: Any) -> str | None:
        if source.secret_key_ref is not None or source.config_map_key_ref is not None:
            ref = source.secret_key_ref or source.config_map_key_ref
            kind = "secret" if source.secret_key_ref is not None else "configmap"
            data = (self._secret if kind == "secret" else self._config_map)(ref.name)
            if data is None:
                if ref.optional:
                    return None
                raise _ConfigError(f'{kind} "{ref.name}" not found')
            if ref.key not in data:
                if ref.optional:
                    return None
                raise _ConfigError(f"couldn't find key {ref.key} in {kind.capitalize()} "
                                   f"{self.namespace}/{ref.name}")
            return data[ref.key]
        if source.field_ref is not None:
            path = source.field_ref.field_path
            fields = {"metadata.name": pod.metadata.name,
                      "metadata.namespace": pod.metadata.namespace,
                      "metadata.uid": pod.metadata.uid, "spec.nodeName": pod.spec.node_name,
                      "spec.serviceAccountName": pod.spec.service_account_name or "",
                      "status.podIP": record.ip, "status.hostIP": "127.0.0.1",
                      "status.podIPs": record.ip}
            match = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
            if match:
                return ((pod.metadata.labels if match[1] == "labels"
                         else pod.metadata.annotations) or {}).get(match[2], "")
            return fields.get(path, "")
        if source.resource_field_ref is not None:
            return _resource_value(pod, source.resource_field_ref)
        return None

    # -- running the pod -----------------------------------------------------------------------
    # Statuses take the shapes a real kubelet (Kubernetes 1.36.3, containerd, in the kind
    # sandbox) writes; tests/uniflow/plugins/ray/kuberay/real_kubelet_pods.json holds such pods
    # and test_kubelet_double_shapes compares the two. Containers run one at a time: the init
    # containers in order, each to success, then the first container.
    def _step(self, pod: Any, record: PodRecord) -> None:
        if "image_error" not in record.extra:
            self._advance(pod, record)
        status = pod_status(pod, record)
        text = json.dumps(status, sort_keys=True)
        if text != record.reported:
            self._core.patch_namespaced_pod_status(pod.metadata.name, self.namespace,
                                                   {"status": status})
            record.reported = text

    def _current(self, pod: Any, record: PodRecord) -> Any:
        inits = pod.spec.init_containers or []
        return inits[record.init_index] if record.init_index < len(inits) \
            else pod.spec.containers[0]

    def _advance(self, pod: Any, record: PodRecord) -> None:
        inits = pod.spec.init_containers or []
        if record.proc is None:
            if time.monotonic() >= record.restart_at:
                self._launch(pod, record, self._current(pod, record))
            return
        code = record.proc.poll()
        if code is None:
            if record.init_index >= len(inits):
                self._probe(pod, record)
            return
        container = self._current(pod, record)
        run = record.runs[container.name][-1]
        run.update(finishedAt=_now(), exitCode=code, reason="Completed" if code == 0
                   else "Error")
        _end_processes(lambda p: os.getsid(p.pid) == record.proc.pid)
        record.proc = None
        record.ready = False
        if code == 0 and record.init_index < len(inits):
            record.init_index += 1  # the next one starts at once
            record.restart_at = 0.0
            return
        # restartPolicy Always: the kubelet starts a failed container again at once the
        # first time, then after a back-off of 10 s that doubles up to 300 s.
        ran = len(record.runs[container.name])
        record.restart_at = time.monotonic() + (1.0 if ran == 1
                                                else min(10.0 * 2 ** (ran - 2), 300.0))
        # A restarted container starts from its image again, as a real runtime's does:
        # nothing the last one wrote in its file system (Ray's session folders and
        # sockets, its home) is there for the next start to trip over.
        shutil.rmtree(record.temp_dir, ignore_errors=True)
        os.makedirs(record.temp_dir)
        self._tell_crash(record, container.name, code)

    def _launch(self, pod: Any, record: PodRecord, container: Any) -> None:
        try:
            env = self._environment(pod, record, container)
        except _ConfigError as exc:  # retried on every pass, as a kubelet does
            record.waiting = {"reason": "CreateContainerConfigError", "message": str(exc)}
            return
        record.waiting = None
        words = [*(container.command or []), *(container.args or [])]
        if not words:  # the image's entrypoint: the Ray image has none that would serve
            words = ["bash", "-c", "sleep infinity"]
        record.env = env
        with open(record.log, "ab") as handle:
            handle.write(f"--- {container.name}\n".encode())
            handle.flush()
            record.proc = subprocess.Popen(words, stdout=handle, stderr=subprocess.STDOUT,
                                           stdin=subprocess.DEVNULL, env=env,
                                           start_new_session=True)
        record.runs.setdefault(container.name, []).append(
            {"containerID": f"containerd://{os.urandom(32).hex()}", "startedAt": _now()})
        record.started_at = time.monotonic()
        record.ready = False
        record.probe_at = 0.0

    def _tell_crash(self, record: PodRecord, container: str, code: int | None) -> None:
        # Where a kubectl user would read `kubectl logs`: the test's captured stderr, shown
        # when it fails (the log folder goes when the double stops).
        tail = self.pod_log(record.name).splitlines()[-40:]
        sys.stderr.write(f"kubelet double: container {container} of pod {record.name} exited "
                         f"with {code} (run {len(record.runs[container])}); the end of its "
                         "log:\n" + "\n".join(tail) + "\n")

    def _probe(self, pod: Any, record: PodRecord) -> None:
        probe = pod.spec.containers[0].readiness_probe
        now = time.monotonic()
        if probe is None:
            record.ready = True
            return
        if now - record.started_at < (probe.initial_delay_seconds or 0) or now < record.probe_at:
            return
        record.probe_at = now + (probe.period_seconds or 10)
        timeout = probe.timeout_seconds or 1
        if probe.http_get is not None:
            port = str(probe.http_get.port)
            url = f"http://{record.ip}:{record.ports.get(port, port)}{probe.http_get.path or '/'}"
            ok = _http_ok(url, timeout, None)
        elif (action := _exec_action(probe)) is not None:
            # KubeRay's exec probe: `wget ... http://localhost:PORT/PATH | grep success && ...`
            script = " ".join(action.command or [])
            urls = re.findall(r"http://(?:localhost|127\.0\.0\.1):(\d+)(/\S*)", script)
            ok = bool(urls) and all(
                _http_ok(f"http://{record.ip}:{record.ports.get(p, p)}{path}", timeout,
                         "success" if "grep success" in script else None)
                for p, path in urls)
        else:
            ok = True
        record.ready = ok

    def _kill(self, record: PodRecord) -> None:
        if record.proc is not None and record.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(record.proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                record.proc.wait(timeout=10)
        # What is left of the container's session, and what left it (a Ray job's driver runs in
        # a session of its own) but still carries the pod's environment: a container's end
        # takes both, as its cgroup would.
        session = record.proc.pid if record.proc is not None else None
        _end_processes(lambda p: os.getsid(p.pid) == session
                       or p.environ().get("UF_POD_IP") == record.ip)
        shutil.rmtree(record.temp_dir, ignore_errors=True)
        remove_pod_address(record.ip)


def pod_status(pod: Any, record: PodRecord) -> dict[str, Any]:
    """The status a 1.36 kubelet would write for the pod as ``record`` says it runs."""
    inits = pod.spec.init_containers or []
    initialized = record.init_index >= len(inits)
    main = pod.spec.containers[0]
    ready = initialized and record.proc is not None and record.ready
    not_ready = [c.name for c in pod.spec.containers if not (ready and c is main)]
    unfinished = [c.name for c in inits[record.init_index:]]
    conditions = [
        _condition(record, "PodReadyToStartContainers", True),
        _condition(record, "Initialized", initialized, "ContainersNotInitialized",
                   f"containers with incomplete status: [{' '.join(unfinished)}]"),
        _condition(record, "Ready", ready, "ContainersNotReady",
                   f"containers with unready status: [{' '.join(not_ready)}]"),
        _condition(record, "ContainersReady", ready, "ContainersNotReady",
                   f"containers with unready status: [{' '.join(not_ready)}]"),
        _condition(record, "PodScheduled", True),
    ]
    status: dict[str, Any] = {
        # Running once the first container has started; a crash loop stays Running.
        "phase": "Running" if record.runs.get(main.name) else "Pending",
        "conditions": conditions,
        "hostIP": "127.0.0.1", "hostIPs": [{"ip": "127.0.0.1"}],
        "podIP": record.ip, "podIPs": [{"ip": record.ip}],
        "startTime": record.start_time,
    }
    if inits:
        status["initContainerStatuses"] = [
            _container_status(pod, record, c, index)
            for index, c in enumerate(inits)]
    status["containerStatuses"] = [
        _container_status(pod, record, c, len(inits) + index)
        for index, c in enumerate(pod.spec.containers)]
    return status


def _condition(record: PodRecord, kind: str, true: bool, reason: str = "",
               message: str = "") -> dict[str, Any]:
    value = "True" if true else "False"
    seen = record.transitions.get(kind)
    if seen is None or seen[0] != value:
        seen = record.transitions[kind] = (value, _now())
    condition = {"type": kind, "status": value, "lastProbeTime": None,
                 "lastTransitionTime": seen[1]}
    if not true and reason:
        condition.update(reason=reason, message=message)
    return condition


def _container_status(pod: Any, record: PodRecord, container: Any,
                      index: int) -> dict[str, Any]:
    """One container's status; ``index`` counts the init containers first."""
    runs = record.runs.get(container.name, [])
    main = index == len(pod.spec.init_containers or [])
    status: dict[str, Any] = {
        "name": container.name, "image": container.image,
        "imageID": _IMAGE_ID if runs else "", "lastState": {}, "ready": False,
        "restartCount": max(len(runs) - 1, 0), "started": False}
    if runs:
        status["containerID"] = runs[-1]["containerID"]
    if len(runs) >= 2:
        status["lastState"] = {"terminated": _terminated(runs[-2])}
    bad = record.extra.get("image_error")
    if bad is not None:
        # The first container with the image shows the pull; those after it wait.
        first = next(i for i, c in enumerate(_in_order(pod)) if c.image == bad)
        status["state"] = {"waiting": _pull_failure(bad, record.admitted) if index == first
                           else {"reason": "PodInitializing"}}
        return status
    if index < record.init_index:  # an init container that completed
        status.update(ready=True, state={"terminated": _terminated(runs[-1])})
    elif index == record.init_index:
        if record.waiting is not None:
            status["state"] = {"waiting": dict(record.waiting)}
        elif record.proc is not None:
            status.update(started=True, ready=main and record.ready,
                          state={"running": {"startedAt": runs[-1]["startedAt"]}})
        elif runs:  # ended; waits for its restart (a 1.36 kubelet shows the run)
            status["state"] = {"terminated": _terminated(runs[-1])}
        else:
            status["state"] = {"waiting": {"reason": "ContainerCreating"}}
    else:
        status["state"] = {"waiting": {"reason": "PodInitializing"}}
    return status


def _in_order(pod: Any) -> list[Any]:
    return [*(pod.spec.init_containers or []), *pod.spec.containers]


def _pod_processes(subnet: str) -> list[tuple[int, str]]:
    """``(pid, pod IP)`` of every process started in a pod of the double whose subnet this is
    (found by the ``UF_POD_IP`` each pod's processes inherit)."""
    import psutil

    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            ip = proc.environ().get("UF_POD_IP", "")
            if ip.startswith(f"{subnet}.") and proc.pid != os.getpid():
                found.append((proc.pid, ip))
    return found


def _end_processes(match: Callable[[Any], bool]) -> None:
    """Kill every process (but this one) that ``match`` selects, and wait for them to end;
    sweeps again, at most three times, for children that appeared meanwhile."""
    import psutil

    for _ in range(3):
        left = []
        for proc in psutil.process_iter():
            with contextlib.suppress(psutil.Error, OSError):
                if proc.pid != os.getpid() and match(proc):
                    proc.kill()
                    left.append(proc)
        if not left:
            return
        psutil.wait_procs(left, timeout=5)


def _expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) references to variables defined before."""
    return re.sub(r"\$\((\w+)\)", lambda m: env.get(m[1], m[0]), value)


def _resource_value(pod: Any, ref: Any) -> str:
    from kubernetes.utils import parse_quantity

    container = next((c for c in pod.spec.containers
                      if not ref.container_name or c.name == ref.container_name),
                     pod.spec.containers[0])
    kind, _, name = ref.resource.partition(".")
    amounts = (container.resources.limits if kind == "limits" else
               container.resources.requests) or {}
    if name not in amounts:
        return "0"
    quantity = parse_quantity(amounts[name])
    divisor = parse_quantity(ref.divisor or "1")
    value = quantity / divisor
    return str(int(-(-value // 1)))  # rounded up, as the kubelet does


def _http_ok(url: str, timeout: float, needle: str | None) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            body = response.read(1 << 16).decode(errors="replace")
            return response.status == 200 and (needle is None or needle in body)
    except Exception:
        return False


def _exec_action(probe: Any) -> Any:
    """A probe's ``exec`` action: the client names the attribute ``_exec`` up to 36.x and
    ``var_exec`` from 37 (``exec`` is a Python keyword)."""
    for name in ("var_exec", "_exec"):
        if hasattr(probe, name):
            return getattr(probe, name)
    return None


# What the image ID of a container of the (only) image the double "has" looks like: the name
# containerd gives an image ``ctr images import --digests`` loaded.
_IMAGE_ID = "docker.io/library/import-2026-01-01@sha256:" + "0" * 64


def _terminated(run: dict[str, Any]) -> dict[str, Any]:
    return {key: run[key] for key in ("containerID", "exitCode", "finishedAt", "reason",
                                      "startedAt")}


def _pull_failure(image: str, since: float) -> dict[str, str]:
    """A kubelet's pull of an image no registry has: ``ErrImagePull`` at each try, and
    ``ImagePullBackOff`` between tries (10 s after the first, the wait doubling)."""
    error = (f'failed to pull and unpack image "{image}": failed to resolve reference '
             f'"{image}": not found (the kubelet double has only the Ray image)')
    elapsed, attempt_at, wait = time.monotonic() - since, 0.0, 10.0
    while attempt_at + wait <= elapsed:
        attempt_at, wait = attempt_at + wait, min(wait * 2, 300.0)
    if elapsed - attempt_at < 2.0:
        return {"reason": "ErrImagePull", "message": error}
    return {"reason": "ImagePullBackOff",
            "message": f'Back-off pulling image "{image}": ErrImagePull: {error}'}
