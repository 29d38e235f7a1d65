"""Cluster lifecycle shared by every provisioner: pending -> ready -> deleted (or failed)."""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from michelangelo.uniflow.plugins.ray._capacity import ClusterShape
    from michelangelo.uniflow.plugins.ray._config import RayTask


class ClusterState(str, enum.Enum):
    PENDING = "pending"  # processes or pods requested, head not reachable yet
    READY = "ready"  # the driver is connected; worker nodes may still be joining
    FAILED = "failed"
    DELETED = "deleted"


class RayCluster:
    """A Ray cluster a uniflow run owns or borrows. Provisioners subclass it."""

    state: ClusterState = ClusterState.PENDING
    address: str = ""
    dashboard_url: str | None = None
    task: RayTask

    def start(self) -> None:
        """Bring the head up and connect this driver to it (worker nodes may lag)."""
        raise NotImplementedError

    def wait_for_nodes(self, timeout_s: float,
                       enough: Callable[[], bool] | None = None) -> None:
        """Block until every declared node has joined, or raise ``ClusterError``.

        ``enough``, when given, is asked as nodes join: once it says True the wait ends
        with the rest still joining (Ray Train workers that can already be placed).
        """
        raise NotImplementedError

    def shutdown(self) -> None:
        """Disconnect and remove whatever this cluster started; safe to call twice."""
        raise NotImplementedError

    def collect_logs(self, destination: str) -> None:
        """Copy the Ray worker logs written so far into ``destination`` (if reachable)."""
        return None

    def shape(self) -> ClusterShape:
        from michelangelo.uniflow.plugins.ray._capacity import ClusterShape

        return ClusterShape.from_ray_task(self.task)

    def can_host(self, task: RayTask) -> bool:
        """Whether ``task``'s cluster fits inside this one, node for node."""
        if task.runtime_env != self.task.runtime_env:
            return False
        from michelangelo.uniflow.plugins.ray._capacity import ClusterShape, unplaced_node

        return unplaced_node(ClusterShape.from_ray_task(task).nodes, self.shape().nodes) is None
