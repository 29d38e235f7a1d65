"""free_port: the ports we choose for Ray processes and Serve proxies before they bind them."""

from __future__ import annotations

import json
import random
import socket
import subprocess
import sys

import pytest

from michelangelo.uniflow.plugins.ray.provisioning import free_port

# Ports of the blocks given out so far: this process may still hold reservations in them.
_given: set[int] = set()


def _free_block(width: int) -> int:
    """The first port of ``width`` consecutive ports that are free now, below Ray's worker
    ports, where nothing draws unless told to (so no other test's draws land in it), and
    apart from the blocks earlier tests here were given (their draws are still reserved)."""
    for _ in range(200):
        low = random.randint(3000, 9000 - width)
        if _given.intersection(range(low, low + width)):
            continue
        held = []
        try:
            for port in range(low, low + width):
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                held.append(sock)
                sock.bind(("", port))
        except OSError:
            continue
        finally:
            for sock in held:
                sock.close()
        _given.update(range(low, low + width))
        return low
    raise RuntimeError("no free block of ports")


def test_a_port_is_never_handed_out_twice_before_anything_binds_it():
    # The KubeRay bed picked a Serve port for the quickstart, then (before the deploy task
    # bound it) gave the same port to a pod's dashboard agent, and the deploy failed.
    # Earlier tests in this process may have been handed some of these ports already (and
    # released them since), so the draws may be fewer than 8; they must never repeat, and
    # once the range is used up free_port must say so instead of repeating one.
    low = _free_block(8)
    ports: list[int] = []
    with pytest.raises(RuntimeError, match=f"no free port between {low} and {low + 7}"):
        for _ in range(9):
            ports.append(free_port(low=low, high=low + 7))
    assert len(set(ports)) == len(ports), ports
    assert set(ports) <= set(range(low, low + 8)), ports


def test_a_port_held_on_loopback_is_not_free_for_another_address():
    # Ray's dashboard agent binds the port it is given on its node's address and on
    # 127.0.0.1, so a port must be free on every address, not only on the one asked for.
    port = _free_block(1)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", port))
        with pytest.raises(RuntimeError, match="no free port"):
            free_port(low=port, high=port, host="127.0.0.2")


# A process that draws every port of a range, prints them, and keeps its reservations until
# its stdin closes.
_DRAW_ALL = """
import json, sys
from michelangelo.uniflow.plugins.ray.provisioning import free_port
low, high = int(sys.argv[1]), int(sys.argv[2])
ports = []
try:
    while True:
        ports.append(free_port(low=low, high=high))
except RuntimeError:
    pass
print(json.dumps(ports), flush=True)
sys.stdin.read()
"""


def _drawer(low: int, high: int) -> tuple[subprocess.Popen, list[int]]:
    proc = subprocess.Popen([sys.executable, "-c", _DRAW_ALL, str(low), str(high)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    return proc, json.loads(proc.stdout.readline())


def test_a_port_another_running_process_was_handed_is_not_handed_out_again():
    # A test picks a Serve port, then runs `michelangelo run`, whose local cluster picks its
    # own ports in another process before anything binds the first one.
    low = _free_block(6)
    other, theirs = _drawer(low, low + 5)
    try:
        assert sorted(theirs) == list(range(low, low + 6))
        with pytest.raises(RuntimeError, match="no free port"):
            free_port(low=low, high=low + 5)
    finally:
        other.stdin.close()
        other.wait(timeout=30)


def test_the_ports_of_a_process_that_ended_are_free_again():
    low = _free_block(4)
    first, ports = _drawer(low, low + 3)
    first.stdin.close()
    assert first.wait(timeout=30) == 0
    second, again = _drawer(low, low + 3)
    second.stdin.close()
    second.wait(timeout=30)
    assert sorted(ports) == sorted(again) == list(range(low, low + 4))
