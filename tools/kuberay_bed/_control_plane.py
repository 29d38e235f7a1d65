"""A real Kubernetes control plane on loopback with the real KubeRay operator: etcd,
kube-apiserver, kube-controller-manager, kube-scheduler and kuberay-operator as processes.

Built by ``tools/build_kuberay_bed.sh`` from the Go module proxy (Kubernetes v1.36, the etcd
release it requires, KubeRay v1.7.0, or v1.6.2 where v1.7.0 cannot be had). It gives the
KubeRay tests real CRD validation, dry runs, watches, Events, a real scheduler binding pods to
Node objects, the real garbage collector and EndpointSlice controller, and the operator's own
reconcilers. The doubles are the kubelet (``_kubelet_double``), since no container runtime
runs here, and the pod network and cluster DNS it would give (``_pod_network_double``).
"""

from __future__ import annotations

import contextlib
import os
import re
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

REPO = Path(__file__).resolve().parents[2]
CRD_DIR = REPO.parent / "shared" / "kuberay" / "crds"
BUILD_SCRIPT = REPO / "tools" / "build_kuberay_bed.sh"
# The kuberay-operator chart's default feature gates (helm-chart/kuberay-operator/values.yaml)
# per operator release the bed can run: v1.7.0, or v1.6.2 where v1.7.0 cannot be built.
FEATURE_GATES = {
    "1.7": ("RayClusterStatusConditions=true,RayJobDeletionPolicy=true,"
            "RayMultiHostIndexing=true,RayServiceIncrementalUpgrade=true,"
            "RayCronJob=false,RayClusterMTLS=false,RayClusterNetworkPolicy=false,"
            "RayClusterHistoryServer=false"),
    "1.6": ("RayClusterStatusConditions=true,RayJobDeletionPolicy=true,"
            "RayMultiHostIndexing=true,RayServiceIncrementalUpgrade=false,RayCronJob=false"),
}
# What the controller-manager runs: the controllers a cluster without kubelets can use (no
# node lifecycle controller: the nodes here send no heartbeats).
CONTROLLERS = ("garbage-collector-controller,endpointslice-controller,"
               "endpointslice-mirroring-controller,namespace-controller,"
               "resourcequota-controller")
# The kubeconfig context of the plane's second user, "developer", whom RBAC allows nothing
# beyond what every signed-in user may do until a test binds it a role.
DEVELOPER_CONTEXT = "uf-test-developer"
# The Node objects the bed registers (``ControlPlane.add_node``) and the kubelet double serves:
# a larger and a smaller node, so that the fit check and the scheduler have a choice to make.
NODES = {"node-a": {"cpu": "4", "memory": "8Gi"}, "node-b": {"cpu": "2", "memory": "4Gi"}}
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def build() -> Path:
    """The folder holding the control plane's binaries (built on first use)."""
    return _build("k8s")


def build_operator() -> Path:
    """The folder holding ``kuberay-operator`` (built on first use): ``.../kuberay-v<X.Y.Z>/bin``,
    which names the release the build script could get (see its header)."""
    return _build("kuberay")


def operator_version(operator_bin: Path) -> str:
    """The KubeRay release of a ``build_operator()`` folder, e.g. ``"1.7.0"``."""
    match = re.fullmatch(r"kuberay-v(\d+\.\d+\.\d+)", operator_bin.parent.name)
    if match is None:
        raise ValueError(f"cannot tell the KubeRay release of {operator_bin}")
    return match.group(1)


def _build(what: str) -> Path:
    out = subprocess.run(["bash", str(BUILD_SCRIPT), what], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{BUILD_SCRIPT.name} {what} failed:\n{out.stderr[-3000:]}")
    return Path(out.stdout.strip().splitlines()[-1])


def _free_port() -> int:
    from michelangelo.uniflow.plugins.ray.provisioning import free_port

    return free_port()


class ControlPlane:
    """Starts the three processes in a private folder and stops exactly those."""

    def __init__(self, bin_dir: Path, operator_bin: Path | None = None) -> None:
        self.bin = bin_dir
        self.operator_bin = operator_bin
        self.dir = Path(tempfile.mkdtemp(prefix="uf-k8s-"))
        self.token = os.urandom(16).hex()
        # A second user, in no group but system:authenticated: RBAC grants it only what a
        # test gives it (see DEVELOPER_CONTEXT).
        self.developer_token = os.urandom(16).hex()
        self.port = _free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        self.kubeconfig = self.dir / "kubeconfig"
        # Where the kubelet double publishes pod and Service addresses (see
        # _pod_network_double); the operator's Service-name calls go through ServiceProxy.
        self.net_file = self.dir / "net.json"
        self.net_file.write_text("{}")
        self._service_proxy: Any = None
        self._procs: list[subprocess.Popen] = []

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> ControlPlane:
        try:
            self._start_etcd()
            self._start_apiserver()
            self._write_kubeconfig()
            self._start_scheduler()
            self._start_controller_manager()
            self.install_crds()
            if self.operator_bin is not None:
                self._start_operator()
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
        if self._service_proxy is not None:
            self._service_proxy.stop()
            self._service_proxy = None
        shutil.rmtree(self.dir, ignore_errors=True)

    def _spawn(self, name: str, args: list[str],
               env: dict[str, str] | None = None) -> subprocess.Popen:
        log = open(self.dir / f"{name}.log", "wb")  # noqa: SIM115  (lives with the process)
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        self._procs.append(proc)
        return proc

    def running(self, name: str) -> bool:
        """Whether the process started as ``name`` still runs."""
        return any(Path(p.args[0]).name == name and p.poll() is None for p in self._procs)

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
        (d / "tokens.csv").write_text(f"{self.token},admin,admin-uid,system:masters\n"
                                      f"{self.developer_token},developer,developer-uid\n")
        self._spawn("kube-apiserver", [
            str(self.bin / "kube-apiserver"), f"--etcd-servers={self.etcd_url}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
            f"--secure-port={self.port}", f"--cert-dir={d / 'certs'}",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={d / 'sa.pub'}",
            f"--service-account-signing-key-file={d / 'sa.key'}",
            "--api-audiences=https://kubernetes.default.svc",
            f"--token-auth-file={d / 'tokens.csv'}", "--authorization-mode=RBAC",
            # Pods need no service account token here (nothing in them calls the API server),
            # and no node lifecycle controller would lift the not-ready taint of a new Node.
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
            "users": [{"name": "admin", "user": {"token": self.token}},
                      {"name": "developer", "user": {"token": self.developer_token}}],
            "contexts": [{"name": "uf-test", "context": {"cluster": "uf-test", "user": "admin"}},
                         {"name": DEVELOPER_CONTEXT,
                          "context": {"cluster": "uf-test", "user": "developer"}}],
        }))

    def _start_scheduler(self) -> None:
        self._spawn("kube-scheduler", [
            str(self.bin / "kube-scheduler"), f"--kubeconfig={self.kubeconfig}",
            "--leader-elect=false", "--secure-port=0",
        ])

    def _start_controller_manager(self) -> None:
        self._spawn("kube-controller-manager", [
            str(self.bin / "kube-controller-manager"), f"--kubeconfig={self.kubeconfig}",
            "--leader-elect=false", "--secure-port=0", f"--controllers={CONTROLLERS}",
            "--use-service-account-credentials=false",
            # The garbage collector and EndpointSlices react at once, not after a resync.
            "--concurrent-gc-syncs=5", "--concurrent-service-endpoint-syncs=5",
        ])

    def feature_gates(self) -> str:
        """The chart's default feature gates of the operator release this plane runs."""
        assert self.operator_bin is not None
        release = operator_version(self.operator_bin)
        gates = FEATURE_GATES.get(release.rpartition(".")[0])
        if gates is None:
            raise ValueError(f"no chart feature gates known for KubeRay {release}; add them to "
                             "FEATURE_GATES from that release's helm values.yaml")
        return gates

    def _start_operator(self) -> None:
        """The real KubeRay operator, as the Helm chart runs it (default feature gates)."""
        assert self.operator_bin is not None
        health, metrics = _free_port(), _free_port()
        self.operator_health = f"http://127.0.0.1:{health}"
        from tools.kuberay_bed._pod_network_double import ServiceProxy

        self._service_proxy = ServiceProxy(self.net_file).start()
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("RAY_") and k.lower() not in ("http_proxy", "no_proxy")}
        env.update(KUBECONFIG=str(self.kubeconfig), HTTP_PROXY=self._service_proxy.url,
                   NO_PROXY="127.0.0.1,localhost")
        self._spawn("kuberay-operator", [
            str(self.operator_bin / "kuberay-operator"),
            f"--metrics-addr=127.0.0.1:{metrics}",
            f"--health-probe-bind-address=127.0.0.1:{health}",
            "--enable-leader-election=false", f"--feature-gates={self.feature_gates()}",
            "--enable-metrics=true", "--log-stdout-encoder=console",
        ], env=env)
        self._wait(lambda: _get(f"{self.operator_health}/readyz", None), "kuberay-operator",
                   120)

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
        if not any(CRD_DIR.glob("*.yaml")):
            raise FileNotFoundError(
                f"no KubeRay CRDs (*.yaml) in {CRD_DIR}: the bed installs them from the "
                "shared/kuberay/crds folder beside the checkout. Fix: put the KubeRay CRDs there.")
        for path in sorted(CRD_DIR.glob("*.yaml")):
            crd = yaml.load(path.read_text(), Loader=_LOADER)
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
