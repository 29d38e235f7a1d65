"""Will the cluster's pods fit the Kubernetes nodes? Checked before anything is created.

Each pod must fit some node's free allocatable resources, and all of them must fit together
(placed largest first, each on the node where it leaves the least room). Without this a
RayCluster that can never be scheduled sits Pending until a deadline runs out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from michelangelo.errors import InputError
from michelangelo.uniflow.plugins.ray.provisioning import format_bytes, parse_quantity

_CHECKED = ("cpu", "memory", "nvidia.com/gpu", "ephemeral-storage")
_BYTES = ("memory", "ephemeral-storage")
# The init container KubeRay (1.7) adds to every worker pod to wait for the head's GCS, with
# its fixed requests; the scheduler reserves the larger of it and the pod's containers.
WAIT_GCS_READY = {"name": "wait-gcs-ready",
                  "resources": {"requests": {"cpu": "200m", "memory": "256Mi"},
                                "limits": {"cpu": "200m", "memory": "256Mi"}}}


class ClusterFitError(InputError, ValueError):
    """The RayCluster's pods cannot be placed on the Kubernetes cluster's nodes."""

    uniflow_retryable = False


@dataclass
class _Node:
    name: str
    free: dict[str, Decimal]
    pods: list[str] = field(default_factory=list)


def pod_requests(manifest: dict[str, Any]) -> list[tuple[str, dict[str, Decimal]]]:
    """(pod description, requests) for every pod a RayCluster manifest will make."""
    spec = manifest["spec"]
    pods = [("head pod", _requests(spec["headGroupSpec"]["template"]))]
    for group in spec.get("workerGroupSpecs", []):
        template = group["template"]
        pod_spec = template.get("spec") or {}
        need = _requests({**template, "spec": {
            **pod_spec, "initContainers": [*(pod_spec.get("initContainers") or []),
                                           WAIT_GCS_READY]}})
        count = int(group.get("replicas", 0)) * int(group.get("numOfHosts", 1) or 1)
        pods += [(f"worker pod {i + 1}/{count} of group {group['groupName']!r}", need)
                 for i in range(count)]
    return pods


def check_fit(manifest: dict[str, Any], nodes: list[dict[str, Any]],
              pods: list[dict[str, Any]] | None = None) -> None:
    """Raise :class:`ClusterFitError` unless every pod of ``manifest`` can be scheduled.

    Args:
        manifest: The RayCluster to create.
        nodes: The cluster's Node objects (as dicts).
        pods: Pods already running anywhere; their requests are taken off their nodes.
    """
    free = _free_by_node(nodes, pods or [])
    if not free:
        raise ClusterFitError(
            "the Kubernetes cluster has no schedulable node; add nodes (or uncordon them) "
            "before running RayTasks on it."
        )
    wanted = pod_requests(manifest)
    largest = max(free, key=lambda n: (n.free.get("cpu", 0), n.free.get("memory", 0)))
    for label, need in wanted:
        if not any(_fits(node.free, need) for node in free):
            resource = _short_resource(need, free)
            raise ClusterFitError(
                f"RayCluster {manifest['metadata']['name']!r}: the {label} asks for "
                f"{_describe(need)}, but no node has that much free {resource}; the largest node "
                f"{largest.name!r} has {_describe(largest.free)} free. Fix: shrink the RayTask's "
                f"{'head' if label == 'head pod' else 'worker'}_* fields, or add a bigger node."
            )
    before = "; ".join(f"{n.name}: {_describe(n.free)}" for n in free)
    left_over = _place(wanted, free)
    if left_over is not None:
        raise ClusterFitError(
            f"RayCluster {manifest['metadata']['name']!r}: each pod fits a node, but all "
            f"{len(wanted)} pods together ({_describe(_total(wanted))}) do not; the "
            f"{left_over} is left over. Free per node: {before}. Fix: lower worker_instances "
            "or the per-node resources, or add nodes."
        )


@dataclass(frozen=True)
class RunFit:
    """Whether a new RayCluster fits next to the run's other clusters (see :func:`fit_with_run`).

    Attributes:
        fits: Whether its pods fit the nodes now, next to the run's other clusters.
        waits_for: The run's clusters it must wait for when it does not fit now.
        need: Its pods' requests, summed, described.
        free: What each node has free next to the run's clusters, described.
    """

    fits: bool
    waits_for: tuple[str, ...]
    need: str
    free: str


def fit_with_run(manifest: dict[str, Any], nodes: list[dict[str, Any]],
                 pods: list[dict[str, Any]], run_clusters: list[dict[str, Any]]) -> RunFit:
    """Does ``manifest`` fit the nodes together with the run's other RayClusters?

    The run's clusters are counted by what their manifests ask for, not only by the pods
    that exist: a cluster just created has no pods yet, and two branches checking at once
    must not both take the same room. Their pods already bound to a node hold that node;
    the rest are placed like the new cluster's (largest first, tightest node).

    Args:
        manifest: The RayCluster to create.
        nodes: The Kubernetes cluster's Node objects (as dicts).
        pods: Every pod (as dicts); those of ``run_clusters`` are matched by their
            ``ray.io/cluster`` label.
        run_clusters: The manifests of the run's clusters that stay while this one starts.

    Returns:
        Whether it fits now, and if not which of the run's clusters it waits for.

    Raises:
        ClusterFitError: It could never fit, even with none of the run's clusters left.
    """
    names = {c["metadata"]["name"] for c in run_clusters}
    foreign = [p for p in pods if _cluster_of(p) not in names]
    check_fit(manifest, nodes, foreign)  # with the run's clusters all gone: ever?
    free = _free_by_node(nodes, foreign)
    for cluster in run_clusters:
        name = cluster["metadata"]["name"]
        mine = [p for p in pods if _cluster_of(p) == name]
        bound = [p for p in mine if (p.get("spec") or {}).get("nodeName")
                 and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]
        _take(free, bound)
        _place(_unbound(pod_requests(cluster), bound), free)  # what is left over waits anyway
    wanted = pod_requests(manifest)
    left = "; ".join(f"{n.name}: {_describe({k: max(v, Decimal(0)) for k, v in n.free.items()})}"
                     for n in free)
    fits = _place(wanted, free) is None
    return RunFit(fits, () if fits else tuple(sorted(names)), _describe(_total(wanted)), left)


def copies_that_fit(manifests: list[dict[str, Any]], nodes: list[dict[str, Any]],
                    pods: list[dict[str, Any]]) -> int:
    """How many of ``manifests`` (in order, each a branch's cluster) the nodes hold at once.

    A manifest that could never fit alone is skipped (its branch fails on its own).
    """
    free = _free_by_node(nodes, pods)
    placed = 0
    for manifest in manifests:
        wanted = pod_requests(manifest)
        trial = [_Node(n.name, dict(n.free)) for n in free]
        if _place(wanted, trial) is None:
            free = trial
            placed += 1
    return placed


def describe_free(nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> str:
    """The nodes' free allocatable, summed over nodes, in words."""
    summed = _total([("", n.free) for n in _free_by_node(nodes, pods)])
    return _describe({k: max(v, Decimal(0)) for k, v in summed.items()})


def _cluster_of(pod: dict[str, Any]) -> str | None:
    return ((pod.get("metadata") or {}).get("labels") or {}).get("ray.io/cluster")


def _take(free: list[_Node], pods: list[dict[str, Any]]) -> None:
    by_name = {n.name: n for n in free}
    for pod in pods:
        node = by_name.get((pod.get("spec") or {}).get("nodeName"))
        if node is not None:
            for key, amount in _requests({"spec": pod["spec"]}).items():
                node.free[key] = node.free.get(key, Decimal(0)) - amount


def _unbound(wanted: list[tuple[str, dict[str, Decimal]]],
             bound: list[dict[str, Any]]) -> list[tuple[str, dict[str, Decimal]]]:
    """The pods of ``wanted`` not yet among ``bound`` (matched by head, and worker group)."""
    left = list(wanted)
    for pod in bound:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        if labels.get("ray.io/node-type") == "head":
            match = next((i for i, (label, _) in enumerate(left) if label == "head pod"), None)
        else:
            group = f"of group {labels.get('ray.io/group')!r}"
            match = next((i for i, (label, _) in enumerate(left) if label.endswith(group)), None)
        if match is not None:
            left.pop(match)
    return left


def _place(wanted: list[tuple[str, dict[str, Decimal]]], free: list[_Node]) -> str | None:
    """Book ``wanted`` on ``free`` (largest first, tightest node); the first left over."""
    order = sorted(wanted, key=lambda item: (item[1].get("cpu", 0), item[1].get("memory", 0)),
                   reverse=True)
    for label, need in order:
        candidates = [node for node in free if _fits(node.free, need)]
        if not candidates:
            return label
        best = min(candidates, key=lambda node: node.free.get("cpu", 0) - need.get("cpu", 0))
        for key, amount in need.items():
            best.free[key] = best.free.get(key, Decimal(0)) - amount
        best.pods.append(label)
    return None


def _free_by_node(nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> list[_Node]:
    out: dict[str, _Node] = {}
    for node in nodes:
        spec, status = node.get("spec") or {}, node.get("status") or {}
        if spec.get("unschedulable"):
            continue
        ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                    for c in status.get("conditions") or [])
        if not ready:
            continue
        allocatable = status.get("allocatable") or {}
        out[node["metadata"]["name"]] = _Node(node["metadata"]["name"], {
            key: _quantity(allocatable.get(key, "0"), key) for key in _CHECKED})
    for pod in pods:
        node_name = (pod.get("spec") or {}).get("nodeName")
        phase = (pod.get("status") or {}).get("phase")
        if node_name in out and phase not in ("Succeeded", "Failed"):
            for key, amount in _requests({"spec": pod["spec"]}).items():
                out[node_name].free[key] -= amount
    return list(out.values())


def _requests(template: dict[str, Any]) -> dict[str, Decimal]:
    """A pod's effective requests, as the scheduler counts them: per resource, the sum over
    its containers or the largest init container's, whichever is more."""
    spec = template.get("spec") or {}
    total: dict[str, Decimal] = {}
    for container in spec.get("containers") or []:
        for key, amount in _container_requests(container).items():
            total[key] = total.get(key, Decimal(0)) + amount
    for container in spec.get("initContainers") or []:
        for key, amount in _container_requests(container).items():
            total[key] = max(total.get(key, Decimal(0)), amount)
    return total


def _container_requests(container: dict[str, Any]) -> dict[str, Decimal]:
    resources = container.get("resources") or {}
    asked = resources.get("requests") or resources.get("limits") or {}
    return {key: _quantity(asked[key], key) for key in _CHECKED if key in asked}


def _quantity(value: Any, key: str) -> Decimal:
    return parse_quantity(value, field=key)


def _fits(free: dict[str, Decimal], need: dict[str, Decimal]) -> bool:
    return all(free.get(key, Decimal(0)) >= amount for key, amount in need.items())


def _short_resource(need: dict[str, Decimal], nodes: list[_Node]) -> str:
    for key, amount in need.items():
        if all(node.free.get(key, Decimal(0)) < amount for node in nodes):
            return key
    return "resources on any single node"


def _total(wanted: list[tuple[str, dict[str, Decimal]]]) -> dict[str, Decimal]:
    total: dict[str, Decimal] = {}
    for _, need in wanted:
        for key, amount in need.items():
            total[key] = total.get(key, Decimal(0)) + amount
    return total


def _describe(amounts: dict[str, Decimal]) -> str:
    parts = []
    for key in _CHECKED:
        if key not in amounts:
            continue
        value = amounts[key]
        if key in _BYTES:
            parts.append(f"{key} {format_bytes(int(value))}")
        elif key == "cpu":
            parts.append(f"cpu {value.normalize():f}")
        elif value:
            parts.append(f"{key} {int(value)}")
    return ", ".join(parts) or "nothing"
