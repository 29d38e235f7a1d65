"""TEST DOUBLE of a pod's network namespace and of cluster DNS, for the kubelet double.

Pods here are local processes sharing the host's network; each gets an address of its own,
added to the host's loopback device for the pod's lifetime (``add_pod_address``). The
addresses come from 198.18.0.0/15, the block set aside for network benchmarks (RFC 2544),
which no real network routes: Kubernetes refuses loopback addresses in EndpointSlices, and
the real EndpointSlice controller (which KubeRay's RayService readiness counts on) would
otherwise publish no endpoint for any pod. What a real pod network gives for free (its own
copy of every port, ``<service>.<namespace>.svc.cluster.local`` names) is emulated at two
boundaries. The first is the ``ray`` command the pod's shell runs: the kubelet double puts a
small ``ray`` wrapper first on each pod's PATH; it rewrites the network arguments of
``ray start`` and ``ray health-check`` (well-known ports to the pod's private ones, Service
names to the endpoint pod's address) and then runs the real ``ray``. Everything else in the
operator's command (``ulimit``, the ``wait-gcs-ready`` loop, environment expansion) runs
unchanged in bash. The second is a ``sitecustomize`` on the pod's PYTHONPATH: a Serve proxy
binding ``0.0.0.0:8000`` (as the RayService's Serve config asks, on every pod) binds the
pod's own address instead, so each pod has its own port 8000 as it would in its own network
namespace.

The mapping lives in a JSON file the kubelet double rewrites as pods come and go:
``{"hosts": {name: {"ip": ..., "ports": {"6379": 41234, ...}}}}``, keyed by pod IP and by
every DNS name of a Service whose selector picks that pod.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

# The ports a Ray pod listens on by KubeRay's defaults; each pod gets private ones for them.
VIRTUAL_PORTS = {"port": 6379, "dashboard-agent-listen-port": 52365,
                 "metrics-export-port": 8080, "ray-client-server-port": 10001}

_WRAPPER = """#!{python}
import sys
sys.path.insert(0, {root!r})
from tools.kuberay_bed._pod_network_double import main
main()
"""


# Serve's HTTP port. A pod's proxy binds it on 0.0.0.0, which in a real pod means the pod's
# own addresses; here every pod shares the host, so the shim below binds it to the pod's IP.
SERVE_PORT = 8000

_BIND_SHIM = """# Written by the KubeRay test bed's pod network double.
import os
import socket

_POD_IP = os.environ.get("UF_POD_IP")
if _POD_IP:
    _bind = socket.socket.bind

    def _pod_bind(self, address):
        if (self.family == socket.AF_INET and isinstance(address, tuple)
                and address[0] in ("0.0.0.0", "") and address[1] == {port}):
            address = (_POD_IP, *address[1:])
        return _bind(self, address)

    socket.socket.bind = _pod_bind
"""


def write_wrapper(folder: Path) -> Path:
    """Writes the ``ray`` wrapper into ``folder`` (put it first on the pod's PATH), and the
    bind shim into ``folder/site`` (put that on the pod's PYTHONPATH; see ``SERVE_PORT``)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "ray"
    root = str(Path(__file__).resolve().parents[2])
    path.write_text(_WRAPPER.format(python=sys.executable, root=root))
    path.chmod(0o755)
    site = folder / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(_BIND_SHIM.format(port=SERVE_PORT))
    return path


def pod_subnet() -> str:
    """A /24 of 198.18.0.0/15 for one kubelet double (``"198.18.7"``): two test beds on one
    machine draw different ones, so their pods' addresses never meet."""
    return f"198.{random.choice((18, 19))}.{random.randint(0, 255)}"


def add_pod_address(ip: str) -> None:
    """Puts ``ip`` on the loopback device (needs root: CAP_NET_ADMIN)."""
    done = subprocess.run(["ip", "addr", "replace", f"{ip}/32", "dev", "lo"],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(
            f"the KubeRay test bed could not give a pod the address {ip}: "
            f"`ip addr replace {ip}/32 dev lo` said {done.stderr.strip()!r}. Fix: run the "
            "KubeRay tests as root (they need CAP_NET_ADMIN and iproute2's `ip`).")


def remove_pod_address(ip: str) -> None:
    """Takes ``ip`` off the loopback device again (quietly, if it is already gone)."""
    subprocess.run(["ip", "addr", "del", f"{ip}/32", "dev", "lo"], capture_output=True)


def _resolve(net: dict, host: str, port: str) -> str:
    entry = net.get("hosts", {}).get(host)
    if entry is None:
        return f"{host}:{port}"  # unknown: left as is, and fails as it would without DNS
    return f"{entry['ip']}:{entry['ports'].get(port, port)}"


def rewrite(argv: list[str], env: dict[str, str], net: dict) -> list[str]:
    """The ``ray`` arguments as this pod's network needs them."""
    if not argv:
        return argv
    ip = env["UF_POD_IP"]
    ports = json.loads(env["UF_POD_PORTS"])
    # `--name value` as `--name=value` (KubeRay's wait-gcs-ready loop writes it that way).
    words: list[str] = []
    for word in argv[1:]:
        if words and words[-1] in ("--address", "--port") and not words[-1].endswith("="):
            words[-1] = f"{words[-1]}={word}"
        else:
            words.append(word)
    out = [argv[0]]
    seen = set()
    for word in words:
        key, eq, value = word.partition("=")
        name = key.lstrip("-")
        if eq and key.startswith("--"):
            seen.add(name)
            if name == "address" and ":" in value:
                host, _, port = value.rpartition(":")
                word = f"--address={_resolve(net, host, port)}"
            elif name in VIRTUAL_PORTS:
                word = f"--{name}={ports.get(value, value)}"
            elif name == "dashboard-host":
                word = f"--dashboard-host={ip}"
        out.append(word)
    if argv[0] == "start":
        if "--head" in argv and "port" not in seen:
            out.append(f"--port={ports[str(VIRTUAL_PORTS['port'])]}")
        for name, virtual in VIRTUAL_PORTS.items():
            head_only = name in ("port", "ray-client-server-port")
            if name not in seen and (not head_only or "--head" in argv) and name != "port":
                out.append(f"--{name}={ports[str(virtual)]}")
        out += [f"--node-ip-address={ip}", f"--temp-dir={env['UF_POD_TEMP']}",
                f"--node-manager-port={env['UF_POD_NODE_MANAGER_PORT']}",
                f"--object-manager-port={env['UF_POD_OBJECT_MANAGER_PORT']}",
                "--disable-usage-stats"]
    return out


def main() -> None:
    """Entry point of the wrapper: rewrite, then become the real ``ray``."""
    env = os.environ
    net = json.loads(Path(env["UF_NET_FILE"]).read_text())
    # In-pod clients (KubeRay sets RAY_ADDRESS=127.0.0.1:6379 on the head) reach the pod's GCS.
    address = env.get("RAY_ADDRESS", "")
    if address.startswith(("127.0.0.1:", "localhost:")):
        port = address.rpartition(":")[2]
        ports = json.loads(env["UF_POD_PORTS"])
        os.environ["RAY_ADDRESS"] = f"{env['UF_POD_IP']}:{ports.get(port, port)}"
    real = env["UF_REAL_RAY"]
    args = rewrite(sys.argv[1:], dict(env), net)
    os.execv(real, [real, *args])


class ServiceProxy:
    """TEST DOUBLE of cluster DNS for processes outside the pods (the operator).

    An HTTP forward proxy on 127.0.0.1: the operator runs with ``HTTP_PROXY`` pointing here
    (Go's HTTP client honours it for the dashboard calls it makes by Service name), and each
    request to ``http://<service>.<namespace>.svc.cluster.local:<port>/...`` goes to the pod
    behind that Service, by the same map the pods use. Loopback addresses (pod IPs) are
    reached directly by Go's client and never come here.
    """

    def __init__(self, net_file: Path) -> None:
        import http.server

        self.net_file = net_file
        self.errors: list[str] = []
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _forward(self) -> None:
                import http.client
                import urllib.parse

                url = urllib.parse.urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                try:
                    net = json.loads(proxy.net_file.read_text() or "{}")
                except (OSError, ValueError):
                    net = {}
                target = _resolve(net, url.hostname or "", str(url.port or 80))
                host, _, port = target.rpartition(":")
                # http.client sets Content-Length from the body it sends.
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() not in ("proxy-connection", "connection", "host",
                                                "content-length")}
                try:
                    conn = http.client.HTTPConnection(host, int(port), timeout=30)
                    path = url.path + (f"?{url.query}" if url.query else "")
                    conn.request(self.command, path or "/", body=body, headers=headers)
                    response = conn.getresponse()
                    data = response.read()
                    conn.close()
                except (OSError, http.client.HTTPException) as exc:
                    data = f"no route to {url.netloc}: {exc}".encode()
                    self.send_response(502)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                self.send_response(response.status)
                for key, value in response.getheaders():
                    if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                try:
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    # The operator's client gave up on the request (its own timeout) and
                    # closed the connection: on a real network the answer is just dropped.
                    self.close_connection = True

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _forward

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> ServiceProxy:
        import threading

        threading.Thread(target=self._server.serve_forever, daemon=True,
                         name="service-proxy-double").start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
