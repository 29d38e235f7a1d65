"""A pod's port on 127.0.0.1, through the API server's ``pods/portforward`` (no kubectl).

A listener on loopback accepts connections; each one gets its own WebSocket to the API
server, which hands it to the kubelet of the pod's node, which connects it to the pod's port.
Bytes travel as binary frames on channel 0 (``v4.channel.k8s.io``); the kubelet reports a
failure to reach the port as text on channel 1. The first frame of each channel only names
the port and carries no data.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from collections.abc import Callable
from typing import Any

_log = logging.getLogger(__name__)
_DATA, _ERROR = 0, 1
_CHUNK = 1 << 16


class PortForward:
    """``http://127.0.0.1:<local_port>`` reaching ``port`` of the pod ``pod()`` names.

    Args:
        open_stream: Given ``(pod_name, port)``, a connected WebSocket (``KubeApi`` makes it).
        pod: The pod's current name; asked again when opening a stream fails, so a replaced
            pod (a restarted head) is followed.
        port: The pod's port.
        host: Where the listener binds (loopback unless told otherwise).
    """

    def __init__(self, open_stream: Callable[[str, int], Any], pod: Callable[[], str | None],
                 port: int, *, host: str = "127.0.0.1") -> None:
        self._open_stream = open_stream
        self._pod = pod
        self._pod_name: str | None = None
        self.port = port
        self._listener = socket.create_server((host, 0))
        self.host, self.local_port = self._listener.getsockname()[:2]
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._live: set[Any] = set()
        self.streams_opened = 0
        self.last_error: str | None = None
        # Set when the API server refuses the stream itself (401/403): waiting cannot help.
        self.refused: str | None = None
        self._thread = threading.Thread(target=self._accept, daemon=True,
                                        name=f"port-forward :{self.local_port}->{port}")

    def start(self) -> PortForward:
        self._thread.start()
        return self

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.local_port}"

    def close(self) -> None:
        """Stop listening and end every connection still open."""
        self._closed.set()
        with contextlib.suppress(OSError):  # wakes the accept() blocked in the thread
            self._listener.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            live, self._live = list(self._live), set()
        for thing in live:
            if isinstance(thing, socket.socket):
                _end(thing)
            else:
                with contextlib.suppress(Exception):
                    thing.close()
        self._thread.join(timeout=5)

    # -- plumbing ------------------------------------------------------------------------------
    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True,
                             name=f"port-forward conn :{self.local_port}").start()

    def _stream(self) -> Any:
        """A stream to the pod; when opening fails, the pod's name is looked up again once."""
        error: Exception | None = None
        for fresh in (False, True):
            if fresh or self._pod_name is None:
                self._pod_name = self._pod()
            if self._pod_name is None:
                raise ConnectionError("the pod does not exist (yet)")
            try:
                return self._open_stream(self._pod_name, self.port)
            except Exception as exc:
                error = exc
                if getattr(exc, "status_code", None) in (401, 403):
                    self.refused = _status_message(exc)
                    break
        raise ConnectionError(f"{type(error).__name__}: {error}")

    def _serve(self, conn: socket.socket) -> None:
        try:
            ws = self._stream()
        except Exception as exc:
            self.last_error = f"port-forward to {self._pod_name}:{self.port} failed: {exc}"
            _log.debug(self.last_error)
            _end(conn)
            return
        with self._lock:
            if self._closed.is_set():
                ws.close()
                _end(conn)
                return
            self._live.update((conn, ws))
            self.streams_opened += 1
        upstream = threading.Thread(target=self._upstream, args=(conn, ws), daemon=True)
        upstream.start()
        try:
            self._downstream(ws, conn)
        finally:
            _end(conn)
            upstream.join(timeout=5)
            with contextlib.suppress(Exception):
                ws.close()
            with self._lock:
                self._live.discard(conn)
                self._live.discard(ws)

    def _upstream(self, conn: socket.socket, ws: Any) -> None:
        """Local bytes to the pod: each read becomes one frame on the data channel."""
        try:
            while True:
                data = conn.recv(_CHUNK)
                if not data:
                    break
                ws.send_binary(bytes((_DATA,)) + data)
        except Exception:
            pass
        with contextlib.suppress(Exception):
            ws.close()

    def _downstream(self, ws: Any, conn: socket.socket) -> None:
        """The pod's bytes to the local connection, until either side ends."""
        from websocket import ABNF

        named: set[int] = set()  # channels whose port-naming first frame has arrived
        try:
            while True:
                opcode, frame = ws.recv_data_frame(True)
                if opcode == ABNF.OPCODE_CLOSE:
                    return
                if opcode != ABNF.OPCODE_BINARY or not frame.data:
                    continue
                channel, payload = frame.data[0], frame.data[1:]
                if channel not in named:
                    named.add(channel)
                    continue
                if channel == _DATA:
                    conn.sendall(payload)
                elif channel == _ERROR and payload:
                    self.last_error = payload.decode(errors="replace")
                    _log.debug("port-forward: %s", self.last_error)
        except Exception:
            return


def _end(conn: socket.socket) -> None:
    """Close a connection another thread may be reading: shut it down first, which wakes it."""
    with contextlib.suppress(OSError):
        conn.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        conn.close()


def _status_message(exc: Exception) -> str:
    """The API server's own words in a refused handshake (its Status body), else the error."""
    import json

    body = getattr(exc, "resp_body", None)
    with contextlib.suppress(Exception):
        return json.loads(body)["message"]
    return f"HTTP {getattr(exc, 'status_code', '?')}"
