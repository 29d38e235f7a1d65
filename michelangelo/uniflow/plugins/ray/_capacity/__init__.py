"""The capacity check: what a RayTask's cluster can hold, and Ray Train asked to fit it.

``_shapes``: the shape of a cluster (its nodes and what each offers) and whether a Ray Train
``ScalingConfig`` fits it, with the error that says why not; ``_bookings``: what concurrent
branches sharing one cluster have booked of it; ``_train_check``: the hook that runs the
check before any Ray Train worker is scheduled.
"""

from __future__ import annotations

from michelangelo.uniflow.plugins.ray._capacity._bookings import (
    Ledger,
)
from michelangelo.uniflow.plugins.ray._capacity._shapes import (
    CapacityError,
    ClusterShape,
    NodeShape,
    ResourcesUnavailableError,
    active_ray_task,
    check_fits,
    check_holds,
    current_ray_task,
    current_shape,
    unplaced_node,
)
from michelangelo.uniflow.plugins.ray._capacity._train_check import (
    active_cluster,
)
from michelangelo.uniflow.plugins.ray._capacity._train_check import (
    install as install_capacity_check,
)

__all__ = [
    "CapacityError",
    "ClusterShape",
    "Ledger",
    "NodeShape",
    "ResourcesUnavailableError",
    "active_cluster",
    "active_ray_task",
    "check_fits",
    "check_holds",
    "current_ray_task",
    "current_shape",
    "install_capacity_check",
    "unplaced_node",
]
