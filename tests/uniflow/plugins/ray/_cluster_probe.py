"""Helpers to look at the processes of a uniflow-made local Ray cluster."""

from __future__ import annotations

import os

import psutil


def cluster_sessions() -> list[int]:
    """Session ids of the `ray start` processes of the cluster the running task uses."""
    from michelangelo.uniflow.plugins.ray._capacity import _train_check

    cluster = _train_check._CLUSTER.get()
    cluster.wait_for_nodes(300)  # worker nodes join in the background
    return cluster.node_pids


def survivors(sessions: list[int]) -> list[str]:
    """Processes still alive in any of those sessions."""
    alive = []
    for proc in psutil.process_iter(["pid", "name", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if os.getsid(proc.pid) in sessions:
                alive.append(f"{proc.pid}:{proc.info['name']}")
        except (ProcessLookupError, psutil.NoSuchProcess, PermissionError):
            continue
    return alive
