"""Free loopback ports for the Ray processes we start."""

from __future__ import annotations

import random
import socket


def free_port(low: int = 20000, high: int = 60000) -> int:
    """A port free on 127.0.0.1, outside Ray's worker port range (10002-19999)."""
    for _ in range(200):
        port = random.randint(low, high)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port found on 127.0.0.1")
