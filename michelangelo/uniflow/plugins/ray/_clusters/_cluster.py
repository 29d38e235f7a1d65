"""Cluster lifecycle shared by every provisioner: pending -> ready -> deleted (or failed).

A cluster's state changes only through :meth:`RayCluster.transition`, which checks the move
against the table below (an illegal one is a bug in a provisioner and raises) and stamps the
cluster's ``timeline``: when it entered each state. Provisioners that see more of the way up
(KubeRay: the resource created, a pod scheduled, the head ready) pass through those states;
a local cluster goes straight from pending to ready.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from michelangelo.errors import InternalError

if TYPE_CHECKING:
    from michelangelo.uniflow.plugins.ray._capacity import ClusterShape
    from michelangelo.uniflow.plugins.ray._task import RayTask


class ClusterState(str, enum.Enum):
    PENDING = "pending"  # asked for, nothing started yet
    CREATED = "created"  # the cluster's resource or processes exist; no node placed yet
    SCHEDULED = "scheduled"  # a node of it is placed on a machine
    HEAD_READY = "head ready"  # the head node runs; the driver is not connected yet
    READY = "ready"  # the driver is connected; worker nodes may still be joining
    FAILED = "failed"  # it could not start; what it started is still to be removed
    DELETED = "deleted"  # everything it started is gone

    def can_become(self, other: ClusterState) -> bool:
        """Whether a cluster in this state may move to ``other``."""
        return other in _NEXT[self]


_UP = (ClusterState.PENDING, ClusterState.CREATED, ClusterState.SCHEDULED,
       ClusterState.HEAD_READY, ClusterState.READY)
# On the way up a state may be skipped (a provisioner need not see every step); from any
# state a cluster can be deleted, and until it is ready it can fail.
_NEXT: dict[ClusterState, frozenset[ClusterState]] = {
    **{state: frozenset(_UP[i + 1:]) | {ClusterState.FAILED, ClusterState.DELETED}
       for i, state in enumerate(_UP[:-1])},
    ClusterState.READY: frozenset({ClusterState.FAILED, ClusterState.DELETED}),
    ClusterState.FAILED: frozenset({ClusterState.DELETED}),
    ClusterState.DELETED: frozenset(),
}


class RayCluster:
    """A Ray cluster a uniflow run owns or borrows. Provisioners subclass it."""

    state: ClusterState = ClusterState.PENDING
    address: str = ""
    dashboard_url: str | None = None
    task: RayTask

    @property
    def timeline(self) -> dict[str, float]:
        """When the cluster entered each state it passed through (``time.time()``), by the
        state's value, in order; filled by :meth:`transition` alone."""
        return dict(self.__dict__.setdefault("_timeline", {}))

    def transition(self, state: ClusterState) -> None:
        """Move to ``state``, checked against the lifecycle table, and stamp the timeline.

        Moving to the state the cluster is in does nothing (``shutdown`` twice, a phase seen
        on two polls).

        Raises:
            InternalError: The table has no such move (a bug in the provisioner).
        """
        stamps = self.__dict__.setdefault("_timeline", {})
        if not stamps:
            stamps[self.state.value] = time.time()
        if state is self.state:
            return
        if not self.state.can_become(state):
            raise InternalError(
                f"{type(self).__name__}: {self.state.value} -> {state.value} is not a cluster "
                "transition (a bug in the provisioner; please report it)")
        self.state = state
        stamps[state.value] = time.time()

    def advance(self, state: ClusterState) -> None:
        """:meth:`transition` to ``state`` on the way up, unless the cluster is past it."""
        if self.state in _UP and _UP.index(state) > _UP.index(self.state):
            self.transition(state)

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
