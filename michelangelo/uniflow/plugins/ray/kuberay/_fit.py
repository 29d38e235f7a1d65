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
    order = sorted(wanted, key=lambda item: (item[1].get("cpu", 0), item[1].get("memory", 0)),
                   reverse=True)
    for label, need in order:
        candidates = [node for node in free if _fits(node.free, need)]
        if not candidates:
            total = _total(wanted)
            raise ClusterFitError(
                f"RayCluster {manifest['metadata']['name']!r}: each pod fits a node, but all "
                f"{len(wanted)} pods together ({_describe(total)}) do not; the {label} is left "
                f"over. Free per node: "
                + "; ".join(f"{n.name}: {_describe(n.free)}" for n in free)
                + ". Fix: lower worker_instances or the per-node resources, or add nodes."
            )
        best = min(candidates, key=lambda node: node.free.get("cpu", 0) - need.get("cpu", 0))
        for key, amount in need.items():
            best.free[key] = best.free.get(key, Decimal(0)) - amount
        best.pods.append(label)


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
