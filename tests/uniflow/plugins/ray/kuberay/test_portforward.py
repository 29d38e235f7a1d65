"""The port-forward listener's framing and failure handling, over an in-memory stream.

The end-to-end path (real API server, kubelet streaming double, a Ray head) is in
``tests/uniflow/plugins/ray/kuberay/bed/test_provisioner.py``; here the WebSocket is a small in-process stand-in
(``_EchoStreamDouble``) so that each rule of the channel protocol can be checked alone.
"""

from __future__ import annotations

import queue
import socket
import struct
import time

from websocket import ABNF, WebSocketBadStatusException

from michelangelo.uniflow.plugins.ray.kuberay._portforward import PortForward


class _Frame:
    def __init__(self, data: bytes) -> None:
        self.data = data


class _EchoStreamDouble:
    """TEST DOUBLE of one port-forward WebSocket: names the port on both channels, then
    echoes data-channel frames upper-cased, and reports ``b"boom"`` on the error channel."""

    def __init__(self, port: int) -> None:
        self.frames: queue.Queue = queue.Queue()
        named = struct.pack("<H", port)
        self.frames.put((ABNF.OPCODE_BINARY, _Frame(b"\x00" + named)))
        self.frames.put((ABNF.OPCODE_BINARY, _Frame(b"\x01" + named)))
        self.closed = False

    def send_binary(self, data: bytes) -> None:
        assert data[:1] == b"\x00"
        if data[1:] == b"fail":
            self.frames.put((ABNF.OPCODE_BINARY, _Frame(b"\x01boom")))
            self.frames.put((ABNF.OPCODE_CLOSE, _Frame(b"")))
            return
        self.frames.put((ABNF.OPCODE_BINARY, _Frame(b"\x00" + data[1:].upper())))

    def recv_data_frame(self, control_frame: bool) -> tuple[int, _Frame]:
        return self.frames.get(timeout=10)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.frames.put((ABNF.OPCODE_CLOSE, _Frame(b"")))


def _roundtrip(forward: PortForward, payload: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", forward.local_port), timeout=10) as conn:
        conn.sendall(payload)
        try:
            return conn.recv(1024)
        except ConnectionResetError:  # ended with our bytes unread: ended all the same
            return b""


def _wait_for(condition, timeout_s: float = 10.0) -> None:
    """Until ``condition()`` holds (the listener's threads set what the tests read)."""
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)


def test_bytes_travel_on_the_data_channel_and_port_frames_carry_none():
    opened: list[tuple[str, int]] = []

    def open_stream(pod: str, port: int) -> _EchoStreamDouble:
        opened.append((pod, port))
        return _EchoStreamDouble(port)

    forward = PortForward(open_stream, lambda: "head-1", 8265).start()
    try:
        assert forward.url == f"http://127.0.0.1:{forward.local_port}"
        assert _roundtrip(forward, b"hello") == b"HELLO"
        assert _roundtrip(forward, b"again") == b"AGAIN"  # one stream per connection
        assert opened == [("head-1", 8265), ("head-1", 8265)]
        assert forward.streams_opened == 2
    finally:
        forward.close()


def test_error_channel_text_is_kept_and_the_connection_ends():
    forward = PortForward(lambda pod, port: _EchoStreamDouble(port), lambda: "head-1",
                          8265).start()
    try:
        assert _roundtrip(forward, b"fail") == b""
        _wait_for(lambda: forward.last_error is not None)
        assert forward.last_error == "boom"
        assert forward.refused is None
    finally:
        forward.close()


def test_a_replaced_pod_is_looked_up_again():
    names = iter(["head-old", "head-new"])

    def open_stream(pod: str, port: int) -> _EchoStreamDouble:
        if pod == "head-old":
            raise WebSocketBadStatusException("Handshake status 404 Not Found", 404)
        return _EchoStreamDouble(port)

    forward = PortForward(open_stream, lambda: next(names), 6379).start()
    try:
        assert _roundtrip(forward, b"x") == b"X"
    finally:
        forward.close()


def test_a_refused_stream_is_marked_so_the_wait_can_end_at_once():
    body = b'{"kind":"Status","message":"pods \\"h\\" is forbidden: no portforward for you"}'

    def open_stream(pod: str, port: int) -> None:
        raise WebSocketBadStatusException("Handshake status 403 Forbidden", 403,
                                          resp_body=body)

    forward = PortForward(open_stream, lambda: "h", 8265).start()
    try:
        assert _roundtrip(forward, b"x") == b""
        _wait_for(lambda: forward.refused is not None)
        assert forward.refused == 'pods "h" is forbidden: no portforward for you'
        assert "403" in (forward.last_error or "")
    finally:
        forward.close()
    port = forward.local_port
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        raise AssertionError("the listener should be closed")
    except ConnectionRefusedError:
        pass
