"""Free loopback ports for the Ray processes (and Serve proxies) we start."""

from __future__ import annotations

import random
import socket
import threading

_RAY_WORKER_PORTS = (10002, 19999)


def _ephemeral_range() -> tuple[int, int]:
    """The kernel's range for outgoing connections' local ports (Linux default if unknown)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as handle:
            low, high = (int(part) for part in handle.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def _candidates(low: int, high: int) -> list[tuple[int, int]]:
    """``[low, high]`` minus the ephemeral range, so no outgoing connection can take the port
    between our check and the moment the real server binds it (which may be minutes later)."""
    eph_low, eph_high = _ephemeral_range()
    spans = [(low, min(high, eph_low - 1)), (max(low, eph_high + 1), high)]
    spans = [(a, b) for a, b in spans if a <= b]
    return spans or [(low, high)]


def _binds(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


# Ports this process has handed out. A port is often bound minutes after we pick it (a Serve
# proxy binds at deploy time), so "free right now" alone could hand the same port out twice.
_handed_out: set[int] = set()
_lock = threading.Lock()


def free_port(low: int = _RAY_WORKER_PORTS[1] + 1, high: int = 65535, host: str = "127.0.0.1") -> int:
    """A port free on ``host`` and on every other address (a Ray agent given a port for its
    node's address also binds it on loopback), outside Ray's worker ports and the kernel's
    ephemeral range, and never handed out before by this process."""
    spans = _candidates(low, high)
    weights = [b - a + 1 for a, b in spans]
    for _ in range(200):
        a, b = random.choices(spans, weights=weights)[0]
        port = random.randint(a, b)
        with _lock:
            if port in _handed_out or not (_binds(host, port) and _binds("", port)):
                continue
            _handed_out.add(port)
        return port
    raise RuntimeError(f"no free port between {low} and {high} on {host}")
