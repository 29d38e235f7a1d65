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
import warnings
from collections.abc import Callable, Iterator
from typing import Any

from michelangelo.uniflow.core import current_call
from michelangelo.uniflow.plugins.ray._capacity._bookings import Ledger
from michelangelo.uniflow.plugins.ray._capacity._shapes import (
    check_fits,
    current_shape,
    free_now,
    wait_until_free,
    worker_request,
)

_CLUSTER: contextvars.ContextVar[Any] = contextvars.ContextVar(
    "michelangelo_ray_cluster", default=None
)
# The bookings of the branches sharing the active cluster, and where to say that one waits.
_LEDGER: contextvars.ContextVar[tuple[Ledger, Callable[[str], None]] | None] = (
    contextvars.ContextVar("michelangelo_ray_ledger", default=None))
_INSTALLED = False


def node_wait_s() -> float:
    return float(os.environ.get("UF_RAY_NODE_WAIT_S", "180"))


def resource_wait_s() -> float:
    return float(os.environ.get("UF_RAY_RESOURCE_WAIT_S", "60"))


@contextlib.contextmanager
def active_cluster(cluster: Any, ledger: Ledger | None = None,
                   announce: Callable[[str], None] | None = None) -> Iterator[None]:
    token = _CLUSTER.set(cluster)
    booked = _LEDGER.set((ledger, announce or (lambda _: None)) if ledger else None)
    try:
        yield
    finally:
        _LEDGER.reset(booked)
        _CLUSTER.reset(token)


@contextlib.contextmanager
def dispatching(scaling_config: Any, datasets: Any = None) -> Iterator[None]:
    """Check a ScalingConfig against the active RayTask, book it, wait for its resources.

    A request that can never fit fails at once (:class:`CapacityError`); one that fits but
    finds the room booked by concurrent branches waits for them, visibly; then the live
    cluster must have the resources free (bounded wait).
    """
    shape = current_shape(live_fallback=False)
    if shape is None:
        yield
        return
    check_fits(scaling_config, shape)
    if datasets:
        warn_if_data_starves(scaling_config, shape)
    cluster = _CLUSTER.get()
    if cluster is not None:
        # Nodes still joining in the background are waited for only while the workers
        # cannot be placed without them.
        cluster.wait_for_nodes(node_wait_s(), enough=lambda: free_now(scaling_config))
    workers, request = worker_request(scaling_config)
    ledger = _LEDGER.get()
    if ledger is None or workers == 0:
        wait_until_free(scaling_config, timeout_s=resource_wait_s())
        yield
        return
    call = current_call()
    who = call.call_id if call is not None else "a Ray Train fit"
    with ledger[0].hold(who, workers, request, ledger[1]):
        wait_until_free(scaling_config, timeout_s=resource_wait_s())
        yield


def warn_if_data_starves(scaling_config: Any, shape: Any) -> None:
    """Warn when the Train workers leave no CPU for Ray Data to read and feed datasets."""
    workers, request = worker_request(scaling_config)
    left = shape.total().get("CPU", 0.0) - workers * request.get("CPU", 0.0)
    if left < 1:
        warnings.warn(
            f"{workers} Ray Train worker(s) x {request.get('CPU', 0):g} CPU take every CPU of "
            f"{shape.describe()}, leaving none for Ray Data to read and feed the datasets: "
            "training would stall at the first batch. Declare more CPU per node in the "
            "RayTask or lower resources_per_worker['CPU'].",
            stacklevel=4,
        )


def install() -> None:
    """Wrap ``DataParallelTrainer.fit`` once per process (idempotent)."""
    global _INSTALLED
    if _INSTALLED:
        return
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

    original = DataParallelTrainer.fit

    @functools.wraps(original)
    def fit(self, *args: Any, **kwargs: Any):
        with dispatching(self.scaling_config, getattr(self, "datasets", None)):
            return original(self, *args, **kwargs)

    fit.__michelangelo_guard__ = True  # type: ignore[attr-defined]
    DataParallelTrainer.fit = fit
    _INSTALLED = True
