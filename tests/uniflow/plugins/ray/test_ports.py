"""free_port: the ports we choose for Ray processes and Serve proxies before they bind them."""

from __future__ import annotations

import random
import socket

import pytest

from michelangelo.uniflow.plugins.ray.provisioning import free_port


def _free_block(width: int) -> int:
    """The first port of ``width`` consecutive ports that are free now, below the kernel's
    ephemeral range (where free_port draws)."""
    for _ in range(200):
        low = random.randint(20000, 32000 - width)
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
