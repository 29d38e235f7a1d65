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
other image fails to pull as ``ImagePullBackOff``. ``Ready`` follows the container's readiness
probe (``httpGet``, or the operator's ``wget`` exec probe read as its URLs), evaluated on the
probe's own delay and period. A process that dies is restarted with a growing back-off and
reported as ``CrashLoopBackOff`` meanwhile (restartPolicy Always). A pod marked for deletion
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
class _PodProcess:
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
    restarts: int = 0
    restart_at: float = 0.0
    reported: str = ""
    ready: bool = False
    probe_at: float = 0.0
    started_at: float = 0.0
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
        self._pods: dict[str, _PodProcess] = {}
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
        running = (record.proc is not None and record.proc.poll() is None
                   and runs[-1][0] == container)
        if previous:
            ended = mine[:-1] if running else mine
            if record.restarts == 0 or not ended:
                raise ValueError(f"previous terminated container {container!r} in pod "
                                 f"{name!r} not found")
            return "".join(ended[-1])
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

    def _admit(self, pod: Any) -> _PodProcess:
        ip = f"{self._subnet}.{self._next_ip}"
        self._next_ip += 1
        add_pod_address(ip)
        labels = dict(pod.metadata.labels or {})
        head = labels.get("ray.io/node-type") == "head"
        temp_dir = tempfile.mkdtemp(prefix="r", dir="/tmp")
        log = os.path.join(self.log_dir, f"{pod.metadata.name}.log")
        record = _PodProcess(pod.metadata.name, ip, None, log, temp_dir, head, labels)
        record.ports = {str(v): _free_port(ip) for v in VIRTUAL_PORTS.values()}
        record.ports[str(_DASHBOARD_PORT)] = _DASHBOARD_PORT  # the dashboard keeps its port
        bad = [c.image for c in [*(pod.spec.init_containers or []), *pod.spec.containers]
               if not c.image.startswith(self.good_image_prefix)]
        if bad:
            record.extra["image_error"] = (
                f'Failed to pull image "{bad[0]}": not found in any registry')
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

    def _environment(self, pod: Any, record: _PodProcess, container: Any) -> dict[str, str]:
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

    def _value_from(self, pod: Any, record: _PodProcess, name: str, source: Any) -> str | None:
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
    def _step(self, pod: Any, record: _PodProcess) -> None:
        if "image_error" in record.extra:
            state = {"waiting": {"reason": "ImagePullBackOff",
                                 "message": record.extra["image_error"]}}
            self._patch(pod, record, "Pending", False, state, "image")
            return
        inits = pod.spec.init_containers or []
        if record.proc is None:
            container = inits[record.init_index] if record.init_index < len(inits) \
                else pod.spec.containers[0]
            self._launch(pod, record, container)
            if record.proc is None:
                return
        proc = record.proc
        if record.init_index < len(inits):
            if proc.poll() is None:
                self._report_init(pod, record, "running")
                return
            if proc.returncode == 0:
                record.init_index += 1
                record.proc = None
                self._step(pod, record)
                return
            self._crashed(pod, record, inits[record.init_index], init=True)
            return
        if proc.poll() is not None:
            self._crashed(pod, record, pod.spec.containers[0], init=False)
            return
        self._probe(pod, record)
        state = {"running": {"startedAt": _now()}}
        self._patch(pod, record, "Running", record.ready, state,
                    f"running{record.ready}{record.restarts}", restarts=record.restarts)

    def _launch(self, pod: Any, record: _PodProcess, container: Any) -> None:
        try:
            env = self._environment(pod, record, container)
        except _ConfigError as exc:
            state = {"waiting": {"reason": "CreateContainerConfigError", "message": str(exc)}}
            if container.name != pod.spec.containers[0].name:
                self._report_init(pod, record, "config", state=state)
            else:
                self._patch(pod, record, "Pending", False, state, f"config:{exc}")
            return
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
        record.started_at = time.monotonic()
        record.ready = False
        record.probe_at = 0.0

    def _crashed(self, pod: Any, record: _PodProcess, container: Any, *, init: bool) -> None:
        proc = record.proc
        assert proc is not None
        now = time.monotonic()
        if not record.restart_at:
            _end_processes(lambda p: os.getsid(p.pid) == proc.pid)
            # A restarted container starts from its image again, as a real runtime's does:
            # nothing the last one wrote in its file system (Ray's session folders and
            # sockets, its home) is there for the next start to trip over.
            shutil.rmtree(record.temp_dir, ignore_errors=True)
            os.makedirs(record.temp_dir)
            record.restarts += 1
            self._tell_crash(record, container.name, proc.returncode)
            record.restart_at = now + min(5.0 * 2 ** (record.restarts - 1), 60.0)
            record.ready = False
        elif now >= record.restart_at:
            record.restart_at = 0.0
            record.proc = None
            return
        state = {"waiting": {"reason": "CrashLoopBackOff", "message":
                             f"back-off restarting failed container {container.name}"}}
        last = {"terminated": {"exitCode": proc.returncode, "reason": "Error",
                               "finishedAt": _now(), "startedAt": _now()}}
        if init:
            self._report_init(pod, record, f"crash{record.restarts}", state=state, last=last)
            return
        self._patch(pod, record, "Running", False, state, f"crash{record.restarts}",
                    last=last, restarts=record.restarts)

    def _tell_crash(self, record: _PodProcess, container: str, code: int | None) -> None:
        # Where a kubectl user would read `kubectl logs --previous`: the test's captured
        # stderr, shown when it fails (the log folder goes when the double stops).
        tail = self.pod_log(record.name).splitlines()[-40:]
        sys.stderr.write(f"kubelet double: container {container} of pod {record.name} exited "
                         f"with {code} (restart {record.restarts}); the end of its log:\n"
                         + "\n".join(tail) + "\n")

    def _probe(self, pod: Any, record: _PodProcess) -> None:
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
        if ok:
            record.ready = True
        else:
            record.ready = False

    def _report_init(self, pod: Any, record: _PodProcess, key: str,
                     state: dict[str, Any] | None = None,
                     last: dict[str, Any] | None = None) -> None:
        inits = pod.spec.init_containers or []
        statuses = []
        for index, container in enumerate(inits):
            if index < record.init_index:
                s = {"terminated": {"exitCode": 0, "reason": "Completed"}}
            elif index == record.init_index:
                s = state or {"running": {"startedAt": _now()}}
            else:
                s = {"waiting": {"reason": "PodInitializing"}}
            statuses.append({"name": container.name, "image": container.image, "imageID": "",
                             "ready": index < record.init_index,
                             "restartCount": record.restarts if index == record.init_index
                             else 0, "state": s,
                             **({"lastState": last} if last and index == record.init_index
                                else {})})
        key = f"init{record.init_index}:{key}"
        if record.reported == key:
            return
        waiting = [c.name for c in inits[record.init_index:]]
        self._core.patch_namespaced_pod_status(pod.metadata.name, self.namespace, {"status": {
            "phase": "Pending", "podIP": record.ip, "hostIP": "127.0.0.1",
            "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": _now()},
                {"type": "Initialized", "status": "False", "reason": "ContainersNotInitialized",
                 "message": f"containers with incomplete status: [{' '.join(waiting)}]",
                 "lastTransitionTime": _now()},
                {"type": "ContainersReady", "status": "False", "lastTransitionTime": _now()},
                {"type": "Ready", "status": "False", "lastTransitionTime": _now()}],
            "initContainerStatuses": statuses,
            "containerStatuses": [{"name": c.name, "image": c.image, "imageID": "",
                                   "ready": False, "restartCount": 0,
                                   "state": {"waiting": {"reason": "PodInitializing"}}}
                                  for c in pod.spec.containers]}})
        record.reported = key

    def _patch(self, pod: Any, record: _PodProcess, phase: str, ready: bool,
               state: dict[str, Any], key: str, last: dict[str, Any] | None = None,
               restarts: int = 0) -> None:
        if record.reported == key:
            return
        container = pod.spec.containers[0]
        flag = "True" if ready else "False"
        inits = [{"name": c.name, "image": c.image, "imageID": "", "ready": True,
                  "restartCount": 0, "state": {"terminated": {"exitCode": 0,
                                                              "reason": "Completed"}}}
                 for c in pod.spec.init_containers or []]
        status = {
            "phase": phase, "podIP": record.ip, "podIPs": [{"ip": record.ip}],
            "hostIP": "127.0.0.1", "startTime": _now(),
            "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": _now()},
                {"type": "Initialized", "status": "True", "lastTransitionTime": _now()},
                {"type": "ContainersReady", "status": flag, "lastTransitionTime": _now()},
                {"type": "Ready", "status": flag, "lastTransitionTime": _now()},
            ],
            **({"initContainerStatuses": inits} if inits and phase == "Running" else {}),
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
        # What is left of the container's session, and what left it (a Ray job's driver runs in
        # a session of its own) but still carries the pod's environment: a container's end
        # takes both, as its cgroup would.
        session = record.proc.pid if record.proc is not None else None
        _end_processes(lambda p: os.getsid(p.pid) == session
                       or p.environ().get("UF_POD_IP") == record.ip)
        shutil.rmtree(record.temp_dir, ignore_errors=True)
        remove_pod_address(record.ip)


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
