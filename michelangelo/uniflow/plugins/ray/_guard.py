"""The capacity check Ray Train does not do: run before any Train worker is scheduled.

While a RayTask body runs, every ``DataParallelTrainer.fit()`` (``TorchTrainer`` and our
``LightningTrainer`` alike) first places its workers on the RayTask's declared nodes, then
waits (bounded) for the nodes to join and for their resources to be free.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
from collections.abc import Iterator
from typing import Any

from michelangelo.uniflow.plugins.ray._capacity import (
    check_fits,
    current_shape,
    wait_until_free,
)
from michelangelo.uniflow.plugins.ray._cluster import RayCluster

_CLUSTER: contextvars.ContextVar[RayCluster | None] = contextvars.ContextVar(
    "michelangelo_ray_cluster", default=None
)
_INSTALLED = False


def node_wait_s() -> float:
    return float(os.environ.get("UF_RAY_NODE_WAIT_S", "180"))


def resource_wait_s() -> float:
    return float(os.environ.get("UF_RAY_RESOURCE_WAIT_S", "60"))


@contextlib.contextmanager
def active_cluster(cluster: RayCluster) -> Iterator[None]:
    token = _CLUSTER.set(cluster)
    try:
        yield
    finally:
        _CLUSTER.reset(token)


def before_dispatch(scaling_config: Any) -> None:
    """Check a ScalingConfig against the active RayTask and wait for its resources."""
    shape = current_shape(live_fallback=False)
    if shape is None:
        return
    check_fits(scaling_config, shape)
    cluster = _CLUSTER.get()
    if cluster is not None:
        cluster.wait_for_nodes(node_wait_s())
    wait_until_free(scaling_config, timeout_s=resource_wait_s())


def install() -> None:
    """Wrap ``DataParallelTrainer.fit`` once per process (idempotent)."""
    global _INSTALLED
    if _INSTALLED:
        return
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

    original = DataParallelTrainer.fit

    @functools.wraps(original)
    def fit(self, *args: Any, **kwargs: Any):
        before_dispatch(self.scaling_config)
        return original(self, *args, **kwargs)

    fit.__michelangelo_guard__ = True  # type: ignore[attr-defined]
    DataParallelTrainer.fit = fit
    _INSTALLED = True
