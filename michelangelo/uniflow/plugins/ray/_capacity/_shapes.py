"""Place Ray Train workers onto a cluster's nodes before Ray is asked to.

Ray Train on a fixed-size cluster does not compare a ``ScalingConfig`` against the cluster's
resources up front: an oversized request waits for a worker group that never starts. This
module does the placement on the driver, against either a ``RayTask``'s declared shape or a
live cluster's nodes, and raises :class:`CapacityError` with both sides and a fix.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from michelangelo.errors import InputError
from michelangelo.quantity import format_bytes

# A RayTask (``_config``), named by alias: ``_config`` imports this module to check a task's
# shape, so importing it back here would close a circle between the two.
RayTask = Any

# Resource keys Ray adds to every node that a ScalingConfig never asks for.
_IGNORED_PREFIXES = ("node:", "object_store_memory", "accelerator_type:")


class CapacityError(InputError, ValueError):
    """A ``ScalingConfig`` asks for more than the cluster it runs on can hold."""

    uniflow_retryable = False  # retrying cannot make the cluster bigger


class ResourcesUnavailableError(CapacityError):
    """The cluster is big enough, but its resources stayed busy past the wait limit."""


@dataclass(frozen=True)
class NodeShape:
    """One node's schedulable resources (``CPU``, ``GPU``, ``memory`` in bytes, custom)."""

    name: str
    resources: Mapping[str, float]

    def fits(self, request: Mapping[str, float]) -> int:
        """How many workers asking for ``request`` fit on this node."""
        counts = []
        for key, amount in request.items():
            if amount <= 0:
                continue
            counts.append(math.floor(self.resources.get(key, 0.0) / amount + 1e-9))
        return min(counts) if counts else 10**9


@dataclass(frozen=True)
class ClusterShape:
    """The nodes of a cluster and where that description came from."""

    nodes: tuple[NodeShape, ...]
    source: str

    @classmethod
    def from_ray_task(cls, task: RayTask) -> ClusterShape:
        nodes = [NodeShape("head", _node_resources(task, "head"))]
        worker = _node_resources(task, "worker")
        nodes += [NodeShape(f"worker-{i}", worker) for i in range(task.worker_instances)]
        return cls(tuple(nodes), _describe_task(task))

    @classmethod
    def from_live_cluster(cls, *, available: bool = False) -> ClusterShape:
        """The nodes of the cluster this driver is connected to (total or free resources)."""
        import ray

        if available:
            per_node = ray._private.state.available_resources_per_node()
        else:
            per_node = {n["NodeID"]: n["Resources"] for n in ray.nodes() if n.get("Alive")}
        nodes = tuple(
            NodeShape(node_id[:8], _schedulable(resources))
            for node_id, resources in sorted(per_node.items())
        )
        label = "free resources of" if available else "the live Ray cluster"
        return cls(nodes, f"{label} ({_describe_nodes(nodes)})")

    @classmethod
    def from_nodes(cls, nodes: tuple[NodeShape, ...], label: str) -> ClusterShape:
        """A live cluster's nodes as reported elsewhere (e.g. by its dashboard)."""
        nodes = tuple(NodeShape(n.name, _schedulable(n.resources)) for n in nodes)
        return cls(nodes, f"{label} ({_describe_nodes(nodes)})")

    def describe(self) -> str:
        return self.source

    def total(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for node in self.nodes:
            for key, amount in node.resources.items():
                out[key] = out.get(key, 0.0) + amount
        return out


def worker_request(scaling_config: Any) -> tuple[int, dict[str, float]]:
    """``(workers that must be placed, resources per worker)`` of a ``ScalingConfig``."""
    request = dict(scaling_config._resources_per_worker_not_none)
    workers = getattr(scaling_config, "min_workers", None)
    if workers is None:
        workers = scaling_config.num_workers
        if isinstance(workers, tuple):
            workers = workers[0]
    return int(workers), {k: float(v) for k, v in request.items()}


def placeable(shape: ClusterShape, request: Mapping[str, float]) -> int:
    return sum(min(node.fits(request), 10**6) for node in shape.nodes)


def check_fits(scaling_config: Any, shape: ClusterShape) -> None:
    """Raise :class:`CapacityError` unless every worker fits on one node of ``shape``."""
    workers, request = worker_request(scaling_config)
    if workers == 0:
        return  # Ray Train runs num_workers=0 in the driver process.
    fit = placeable(shape, request)
    _record_decision(scaling_config, shape, workers, request, fit)
    if fit >= workers:
        return
    raise CapacityError(_explain(scaling_config, shape, workers, request, fit))


def _record_decision(scaling_config: Any, shape: ClusterShape, workers: int,
                     request: Mapping[str, float], fit: int) -> None:
    """Keep the decision with the running task (``michelangelo runs report`` shows it)."""
    from michelangelo.uniflow.core.plugin import record_artifact

    record_artifact(
        "capacity",
        scaling_config=_describe_scaling(scaling_config),
        cluster=shape.describe(),
        workers=workers,
        per_worker=_describe_request(request),
        placeable=fit,
        fits=fit >= workers,
    )


def unplaced_node(needs: tuple[NodeShape, ...], nodes: tuple[NodeShape, ...]) -> NodeShape | None:
    """The first of ``needs`` that no one-to-one placement onto ``nodes`` can hold, or None.

    An exact matching (augmenting paths), not first fit: a first fit can put a small head on
    the only big node and then find no room for a worker that would have fitted there.
    """
    owner: dict[int, int] = {}  # node index -> need index

    def place(i: int, seen: set[int]) -> bool:
        for j, node in enumerate(nodes):
            if j in seen or node.fits(needs[i].resources) < 1:
                continue
            seen.add(j)
            if j not in owner or place(owner[j], seen):
                owner[j] = i
                return True
        return False

    for i, need in enumerate(needs):
        if not place(i, set()):
            return need
    return None


def check_holds(task: RayTask, live: ClusterShape, *, where: str, fix: str) -> None:
    """Raise :class:`CapacityError` unless ``live`` has a node for each of ``task``'s nodes."""
    need = unplaced_node(ClusterShape.from_ray_task(task).nodes, live.nodes)
    if need is not None:
        raise CapacityError(
            f"{where} points at a cluster that cannot hold {task.describe()}: no free node "
            f"for the {need.name} node ({_describe_request(need.resources)}); the cluster "
            f"has {live.describe()}. Fix: {fix}."
        )


def free_now(scaling_config: Any) -> bool:
    """Whether the live cluster's free resources can place every worker right now."""
    workers, request = worker_request(scaling_config)
    return workers == 0 or placeable(ClusterShape.from_live_cluster(available=True),
                                     request) >= workers


def wait_until_free(scaling_config: Any, *, timeout_s: float, poll_s: float = 0.5) -> None:
    """Wait until the live cluster has enough *free* resources for the workers.

    Raises:
        ResourcesUnavailableError: After ``timeout_s`` with the resources still busy.
    """
    workers, request = worker_request(scaling_config)
    if workers == 0:
        return
    deadline = time.monotonic() + timeout_s
    while True:
        shape = ClusterShape.from_live_cluster(available=True)
        fit = placeable(shape, request)
        if fit >= workers:
            return
        if time.monotonic() >= deadline:
            raise ResourcesUnavailableError(
                f"{_describe_scaling(scaling_config)} needs {workers} worker(s) x "
                f"{_describe_request(request)}, but after waiting {timeout_s:.0f}s only {fit} "
                f"could be placed on the {shape.describe()}. Something else in the cluster "
                "(another trainer, actors or tasks) holds those resources. Fix: let it finish or "
                "stop it, lower num_workers, or raise UF_RAY_RESOURCE_WAIT_S to wait longer."
            )
        time.sleep(poll_s)


# The cluster shape of the RayTask whose body is running, if any.
_ACTIVE: contextvars.ContextVar[tuple[RayTask, ClusterShape] | None] = contextvars.ContextVar(
    "michelangelo_active_ray_task", default=None
)


@contextlib.contextmanager
def active_ray_task(task: RayTask) -> Iterator[None]:
    """Mark ``task``'s declared shape as the one Ray Train workers must fit."""
    token = _ACTIVE.set((task, ClusterShape.from_ray_task(task)))
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def current_ray_task() -> RayTask | None:
    """The ``RayTask`` whose body is running on this driver, or None outside one."""
    active = _ACTIVE.get()
    return active[0] if active else None


def current_shape(*, live_fallback: bool) -> ClusterShape | None:
    """The declared shape of the running RayTask, else (optionally) the live cluster's."""
    active = _ACTIVE.get()
    if active is not None:
        return active[1]
    if live_fallback:
        import ray

        if ray.is_initialized():
            return ClusterShape.from_live_cluster()
    return None


def _node_resources(task: RayTask, role: str) -> dict[str, float]:
    resources = {
        "CPU": task.parsed(f"{role}_cpu"),
        "GPU": float(task.parsed(f"{role}_gpu")),
    }
    memory = task.parsed(f"{role}_memory")
    if memory is not None:
        resources["memory"] = float(memory)
    return resources


def _schedulable(resources: Mapping[str, float]) -> dict[str, float]:
    return {
        k: float(v) for k, v in resources.items() if not k.startswith(_IGNORED_PREFIXES)
    }


def _describe_task(task: RayTask) -> str:
    head = _describe_request(_node_resources(task, "head"))
    text = f"RayTask(head: {head}"
    if task.worker_instances:
        worker = _describe_request(_node_resources(task, "worker"))
        text += f"; {task.worker_instances} x worker: {worker}"
    return text + ")"


def _describe_nodes(nodes: tuple[NodeShape, ...]) -> str:
    return "; ".join(f"{n.name}: {_describe_request(n.resources)}" for n in nodes) or "no nodes"


def _describe_request(request: Mapping[str, float]) -> str:
    parts = []
    for key in sorted(request, key=lambda k: ("CPU", "GPU", "memory").index(k)
                      if k in ("CPU", "GPU", "memory") else 3):
        amount = request[key]
        if key == "GPU" and amount == 0:
            continue
        if key == "memory":
            parts.append(f"memory {format_bytes(amount)}")
        else:
            parts.append(f"{_num(amount)} {key}")
    return ", ".join(parts) or "no resources"


def _describe_scaling(scaling_config: Any) -> str:
    fields = [f"num_workers={scaling_config.num_workers!r}"]
    if scaling_config.use_gpu:
        fields.append("use_gpu=True")
    if scaling_config.resources_per_worker:
        fields.append(f"resources_per_worker={scaling_config.resources_per_worker!r}")
    return f"ScalingConfig({', '.join(fields)})"


def _num(amount: float) -> str:
    return str(int(amount)) if float(amount).is_integer() else f"{amount:g}"


def _explain(scaling_config: Any, shape: ClusterShape, workers: int,
             request: Mapping[str, float], fit: int) -> str:
    want = _describe_scaling(scaling_config)
    head = (
        f"{want} needs {workers} worker(s) x {_describe_request(request)}, each on one node, "
        f"but {shape.describe()} can place only {fit}."
    )
    totals = shape.total()
    missing = [k for k, v in request.items() if v > 0 and totals.get(k, 0.0) == 0.0]
    if missing:
        what = ", ".join(missing)
        fix = (
            f" The cluster declares no {what} at all. Fix: declare it on the cluster "
            f"(e.g. RayTask(worker_gpu=1, ...)) or drop it from the ScalingConfig "
            f"(use_gpu=False / remove it from resources_per_worker)."
        )
        return head + fix
    totals_fit = all(totals.get(k, 0.0) >= v * workers for k, v in request.items() if v > 0)
    if totals_fit:
        biggest = {k: max(n.resources.get(k, 0.0) for n in shape.nodes) for k in request}
        short = [k for k, v in request.items() if biggest.get(k, 0.0) < v]
        detail = ", ".join(f"{k}: largest node has {_amount(k, biggest[k])}, "
                           f"a worker asks {_amount(k, request[k])}" for k in short)
        return (
            head
            + " The totals would fit, but a Ray Train worker cannot span nodes"
            + (f" ({detail})" if detail else "")
            + ". Fix: lower resources_per_worker to fit one node, or raise the per-node size "
            "(e.g. worker_cpu / worker_memory) in the RayTask."
        )
    return (
        head
        + f" Fix: lower num_workers to {fit}, or raise worker_instances (or the per-node "
        "resources) in the RayTask so that every worker has a node slot."
    )


def _amount(key: str, amount: float) -> str:
    return format_bytes(amount) if key == "memory" else _num(amount)
