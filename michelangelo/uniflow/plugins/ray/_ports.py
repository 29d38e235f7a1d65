"""Free loopback ports for the Ray processes (and Serve proxies) we start."""

from __future__ import annotations

import random
import socket

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


def free_port(low: int = _RAY_WORKER_PORTS[1] + 1, high: int = 65535, host: str = "127.0.0.1") -> int:
    """A port free on ``host``, outside Ray's worker ports and the kernel's ephemeral range."""
    spans = _candidates(low, high)
    weights = [b - a + 1 for a, b in spans]
    for _ in range(200):
        a, b = random.choices(spans, weights=weights)[0]
        port = random.randint(a, b)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port found on {host}")
