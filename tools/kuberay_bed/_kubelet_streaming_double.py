"""TEST DOUBLE of the kubelet's streaming server, at its boundary: ``/portForward/NS/POD``
upgrade requests from the real API server in, TCP connections to the pod's address out; and
``/containerLogs/NS/POD/CONTAINER``, what the API server proxies ``pods/log`` to.

A real kubelet serves port-forward streams over HTTPS on its node's kubelet port; the API
server finds that port in the Node's ``status.daemonEndpoints`` and proxies the client's
WebSocket to it unchanged. This double speaks the same WebSocket protocol
(``v4.channel.k8s.io``: per port a data channel and an error channel, each opened with a frame
naming the port) and connects to the pod's address (on the loopback device), which stands in
for the pod's network namespace. Only one port per stream, which is what port-forward clients open.

Logs follow the kubelet's ``getContainerLogs`` and ``validateContainerLogStatus``
(pkg/kubelet/server/server.go, pkg/kubelet/kubelet_pods.go): ``previous=true`` reads the
container's last ended run and is a 400 ``previous terminated container ... not found`` when
it has none; ``tailLines`` keeps the last lines. ``follow``, ``sinceSeconds`` and
``timestamps`` are not served (a 400 says so).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import ssl
import struct
import subprocess
import tempfile
import threading
from collections.abc import Callable

from aiohttp import WSMsgType, web

from michelangelo.uniflow.plugins.ray.provisioning import free_port

PROTOCOL = "v4.channel.k8s.io"


class KubeletStreamingDouble:
    """HTTPS on 127.0.0.1:``port``; ``pod_ip(namespace, name)`` says where a pod lives."""

    def __init__(self, pod_ip: Callable[[str, str], str | None],
                 container_log: Callable[[str, str, str, bool], str] | None = None) -> None:
        self._pod_ip = pod_ip
        # (namespace, pod, container, previous) -> the text; raises LookupError for a pod or
        # container it does not run, ValueError for a run that does not exist.
        self._container_log = container_log
        self.port = free_port()
        self.streams = 0  # port-forward streams that reached a pod
        self.errors: list[str] = []
        self._dir = tempfile.mkdtemp(prefix="uf-kubelet-tls-")
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="kubelet-streaming-double")

    def start(self) -> KubeletStreamingDouble:
        cert, key = os.path.join(self._dir, "kubelet.crt"), os.path.join(self._dir, "kubelet.key")
        # The API server does not verify a kubelet it has no CA for (no
        # --kubelet-certificate-authority), as on a cluster set up without one.
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                        "-subj", "/CN=kubelet-double", "-keyout", key, "-out", cert],
                       check=True, capture_output=True)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert, key)
        app = web.Application()
        app.router.add_get("/portForward/{namespace}/{pod}", self._port_forward)
        app.router.add_get("/containerLogs/{namespace}/{pod}/{container}", self._logs)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._serve(app, context), self._loop).result(30)
        return self

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        shutil.rmtree(self._dir, ignore_errors=True)

    async def _serve(self, app: web.Application, context: ssl.SSLContext) -> None:
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port, ssl_context=context).start()

    async def _logs(self, request: web.Request) -> web.Response:
        info, query = request.match_info, request.query
        unsupported = [k for k in ("follow", "sinceSeconds", "sinceTime", "timestamps",
                                   "limitBytes") if query.get(k) not in (None, "false")]
        if self._container_log is None or unsupported:
            return web.Response(status=400, text=f"not served by this double: {unsupported}")
        try:
            text = self._container_log(info["namespace"], info["pod"], info["container"],
                                       query.get("previous") == "true")
        except LookupError as exc:
            return web.Response(status=404, text=str(exc))
        except ValueError as exc:
            return web.Response(status=400, text=str(exc))
        if "tailLines" in query:
            lines = text.splitlines(keepends=True)
            text = "".join(lines[len(lines) - min(int(query["tailLines"]), len(lines)):])
        return web.Response(text=text)

    async def _port_forward(self, request: web.Request) -> web.StreamResponse:
        namespace, pod = request.match_info["namespace"], request.match_info["pod"]
        ports = [int(p) for value in request.query.getall("port", []) for p in value.split(",")]
        ip = self._pod_ip(namespace, pod)
        if len(ports) != 1 or ip is None:
            return web.Response(status=400, text=f"pod {namespace}/{pod} ports {ports}: no")
        port = ports[0]
        ws = web.WebSocketResponse(protocols=(PROTOCOL,))
        await ws.prepare(request)
        named = struct.pack("<H", port)
        await ws.send_bytes(b"\x00" + named)
        await ws.send_bytes(b"\x01" + named)
        try:
            reader, writer = await asyncio.open_connection(ip, port)
        except OSError as exc:
            await ws.send_bytes(f"\x01error forwarding port {port} to pod {pod}: {exc}".encode())
            await ws.close()
            return ws
        self.streams += 1

        async def upstream() -> None:
            async for message in ws:
                if message.type == WSMsgType.BINARY and message.data[:1] == b"\x00":
                    writer.write(message.data[1:])
                    await writer.drain()
            writer.close()

        async def downstream() -> None:
            while data := await reader.read(1 << 16):
                await ws.send_bytes(b"\x00" + data)
            await ws.close()

        for outcome in await asyncio.gather(upstream(), downstream(), return_exceptions=True):
            if isinstance(outcome, Exception) and not isinstance(outcome, ConnectionError):
                self.errors.append(f"{type(outcome).__name__}: {outcome}")
        return ws
