"""A real Kubernetes control plane on loopback: etcd, kube-apiserver and kube-scheduler.

Built by ``tools/build_k8s_control_plane.sh`` (v1.20.2 from Debian's sources). It gives the
KubeRay tests real CRD validation, dry runs, watches, Events and a real scheduler binding pods
to Node objects. Nothing here is a double; the operator and kubelet doubles live beside it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import ssl
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[6]
CRD_DIR = REPO.parent / "shared" / "kuberay" / "crds"
BUILD_SCRIPT = REPO / "tools" / "build_k8s_control_plane.sh"
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def build() -> Path:
    """The folder holding etcd, kube-apiserver and kube-scheduler (built on first use)."""
    out = subprocess.run(["bash", str(BUILD_SCRIPT)], check=True, capture_output=True, text=True)
    return Path(out.stdout.strip().splitlines()[-1])


def _free_port() -> int:
    from michelangelo.uniflow.plugins.ray._ports import free_port

    return free_port()


class ControlPlane:
    """Starts the three processes in a private folder and stops exactly those."""

    def __init__(self, bin_dir: Path) -> None:
        self.bin = bin_dir
        self.dir = Path(tempfile.mkdtemp(prefix="uf-k8s-"))
        self.token = os.urandom(16).hex()
        self.port = _free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        self.kubeconfig = self.dir / "kubeconfig"
        self._procs: list[subprocess.Popen] = []

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> ControlPlane:
        try:
            self._start_etcd()
            self._start_apiserver()
            self._write_kubeconfig()
            self._start_scheduler()
            self.install_crds()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for proc in reversed(self._procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in reversed(self._procs):
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)
        self._procs.clear()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        log = open(self.dir / f"{name}.log", "wb")  # noqa: SIM115  (lives with the process)
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        self._procs.append(proc)
        return proc

    def log_tail(self, name: str, lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "".join((self.dir / f"{name}.log").read_text(errors="replace")
                           .splitlines(keepends=True)[-lines:])
        return ""

    def _start_etcd(self) -> None:
        client, peer = _free_port(), _free_port()
        self.etcd_url = f"http://127.0.0.1:{client}"
        self._spawn("etcd", [
            str(self.bin / "etcd"), f"--data-dir={self.dir / 'etcd'}",
            f"--listen-client-urls={self.etcd_url}", f"--advertise-client-urls={self.etcd_url}",
            f"--listen-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-cluster=default=http://127.0.0.1:{peer}", "--log-level=warn",
        ])
        self._wait(lambda: _get(f"{self.etcd_url}/health", None), "etcd", 60)

    def _start_apiserver(self) -> None:
        d = self.dir
        subprocess.run(["openssl", "genrsa", "-out", str(d / "sa.key"), "2048"], check=True,
                       capture_output=True)
        subprocess.run(["openssl", "rsa", "-in", str(d / "sa.key"), "-pubout", "-out",
                        str(d / "sa.pub")], check=True, capture_output=True)
        (d / "tokens.csv").write_text(f"{self.token},admin,admin-uid,system:masters\n")
        self._spawn("kube-apiserver", [
            str(self.bin / "kube-apiserver"), f"--etcd-servers={self.etcd_url}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
            f"--secure-port={self.port}", "--insecure-port=0", f"--cert-dir={d / 'certs'}",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={d / 'sa.pub'}",
            f"--service-account-signing-key-file={d / 'sa.key'}",
            "--api-audiences=https://kubernetes.default.svc",
            f"--token-auth-file={d / 'tokens.csv'}", "--authorization-mode=RBAC",
            # No controller-manager makes default service accounts, and nothing would lift the
            # not-ready taint a Node gets at creation.
            "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition",
            "--endpoint-reconciler-type=none", "--service-cluster-ip-range=10.96.0.0/16",
            "--allow-privileged=true",
        ])
        self._wait(lambda: _get(f"{self.url}/readyz", self.token), "kube-apiserver", 180)

    def _write_kubeconfig(self) -> None:
        self.kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "uf-test",
            # The API server's self-signed serving certificate is its own CA.
            "clusters": [{"name": "uf-test", "cluster": {
                "server": self.url,
                "certificate-authority": str(self.dir / "certs" / "apiserver.crt")}}],
            "users": [{"name": "admin", "user": {"token": self.token}}],
            "contexts": [{"name": "uf-test", "context": {"cluster": "uf-test", "user": "admin"}}],
        }))

    def _start_scheduler(self) -> None:
        self._spawn("kube-scheduler", [
            str(self.bin / "kube-scheduler"), f"--kubeconfig={self.kubeconfig}",
            "--leader-elect=false", "--port=0", "--secure-port=0",
        ])

    def _wait(self, probe: Any, name: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._procs[-1].poll() is not None:
                raise RuntimeError(f"{name} exited: {self.log_tail(name)}")
            if probe():
                return
            time.sleep(0.25)
        raise RuntimeError(f"{name} not ready within {timeout_s}s: {self.log_tail(name)}")

    # -- cluster content -----------------------------------------------------------------------
    def api_client(self) -> Any:
        from kubernetes import config

        return config.new_client_from_config(config_file=str(self.kubeconfig))

    def install_crds(self) -> None:
        from kubernetes import client

        api = client.ApiextensionsV1Api(self.api_client())
        for path in sorted(CRD_DIR.glob("*.yaml")):
            crd = crd_for_1_20(yaml.load(path.read_text(), Loader=_LOADER))
            api.create_custom_resource_definition(crd)
        for path in sorted(CRD_DIR.glob("*.yaml")):
            name = yaml.load(path.read_text(), Loader=_LOADER)["metadata"]["name"]
            self._wait(lambda n=name: _established(api, n), f"CRD {name}", 60)

    def add_node(self, name: str, *, cpu: str, memory: str, gpus: int = 0,
                 ephemeral_storage: str = "100Gi", pods: int = 110) -> None:
        """A Node object (no kubelet behind it) with the given allocatable resources."""
        from kubernetes import client

        amounts = {"cpu": cpu, "memory": memory, "ephemeral-storage": ephemeral_storage,
                   "pods": str(pods)}
        if gpus:
            amounts["nvidia.com/gpu"] = str(gpus)
        core = client.CoreV1Api(self.api_client())
        core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {
            "name": name, "labels": {"kubernetes.io/hostname": name}}})
        core.patch_node_status(name, {"status": {
            "capacity": amounts, "allocatable": amounts,
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "message": "uniflow test node",
                            "lastHeartbeatTime": _now(), "lastTransitionTime": _now()}]}})


def crd_for_1_20(crd: dict[str, Any]) -> dict[str, Any]:
    """The three mechanical changes a 1.20 API server needs in the KubeRay 1.7 CRDs."""

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("default") == "":
                del node["default"]  # 1.20 reads an empty-string default as null
            node.pop("x-kubernetes-validations", None)  # CEL rules arrived in 1.25
            keys = node.get("x-kubernetes-list-map-keys")
            items = node.get("items")
            if keys and isinstance(items, dict):
                required = set(items.get("required", []))
                items["required"] = sorted(required | set(keys))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(crd)
    return crd


def _established(api: Any, name: str) -> bool:
    crd = api.read_custom_resource_definition(name)
    return any(c.type == "Established" and c.status == "True"
               for c in (crd.status.conditions or []))


def _get(url: str, token: str | None) -> bool:
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    context = ssl._create_unverified_context()
    try:
        with urllib.request.urlopen(request, timeout=2, context=context) as response:
            return response.status == 200
    except Exception:
        return False


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
