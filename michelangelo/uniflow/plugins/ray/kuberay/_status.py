"""How a ``RayCluster``'s status and pods read: ready, still coming, or refused for good.

KubeRay (1.7) sets ``RayClusterProvisioned`` once every pod that exists runs and is ready; it
does not count them, so a cluster whose worker pods the API server refused (a quota, an
admission webhook) reads as provisioned, and ``ReplicaFailure`` says why. With the
``RayClusterStatusConditions`` feature gate off there are no conditions at all, only
``status.state``. So ready is decided here from the pods themselves, the conditions when they
exist and ``state`` when they do not.
"""

from __future__ import annotations

from typing import Any

# Warning Events KubeRay records on a RayCluster when the API server refuses one of its pods
# (the only trace of it when the status conditions are off).
REFUSED_POD_EVENTS = ("FailedToCreateHeadPod", "FailedToCreateWorkerPod")
_GATED = ("HeadPodReady", "RayClusterProvisioned")


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    """The status condition of type ``kind``, if KubeRay set it."""
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return cond
    return None


def condition_true(obj: dict[str, Any], kind: str) -> bool:
    return (condition(obj, kind) or {}).get("status") == "True"


def has_conditions(obj: dict[str, Any]) -> bool:
    """Whether KubeRay writes status conditions (its ``RayClusterStatusConditions`` gate)."""
    return any(condition(obj, kind) is not None for kind in _GATED)


def refused_pods(obj: dict[str, Any], events: list[dict[str, Any]]) -> str | None:
    """Why KubeRay could not create the cluster's pods, if it says so; None otherwise.

    ``ReplicaFailure`` (reason and the API server's words) when the conditions are on (KubeRay
    removes it once a later attempt succeeds), else the newest Warning Event of
    :data:`REFUSED_POD_EVENTS` about the cluster.
    """
    if has_conditions(obj):
        failure = condition(obj, "ReplicaFailure")
        if failure and failure.get("status") == "True":
            return f"{failure.get('reason')}: {failure.get('message') or 'no message'}"
        return None
    name = obj["metadata"]["name"]
    refused = [e for e in events if e.get("type") == "Warning"
               and e.get("reason") in REFUSED_POD_EVENTS
               and (e.get("involvedObject") or {}).get("name") == name]
    if refused:
        last = max(refused, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
        return f"{last.get('reason')}: {last.get('message') or 'no message'}"
    return None


def pod_ready(pod: dict[str, Any]) -> bool:
    """Running with its ``Ready`` condition True (the readiness probe passed)."""
    status = pod.get("status") or {}
    return status.get("phase") == "Running" and any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or [])


def head_ready(obj: dict[str, Any], pods: list[dict[str, Any]]) -> bool:
    """The head pod is ready: ``HeadPodReady`` where conditions exist, else the pod itself."""
    if has_conditions(obj):
        return condition_true(obj, "HeadPodReady")
    return any(pod_ready(p) for p in _live(pods)
               if (p["metadata"].get("labels") or {}).get("ray.io/node-type") == "head")


def pods_ready(obj: dict[str, Any], pods: list[dict[str, Any]], expected: int) -> bool:
    """All ``expected`` pods exist and are ready, and KubeRay agrees the cluster is up."""
    live = _live(pods)
    if len(live) != expected or not all(pod_ready(p) for p in live):
        return False
    if has_conditions(obj):
        return condition_true(obj, "HeadPodReady") and \
            condition_true(obj, "RayClusterProvisioned") and \
            not condition_true(obj, "ReplicaFailure")
    return (obj.get("status") or {}).get("state") == "ready"


def status_ready(obj: dict[str, Any]) -> bool:
    """Ready as far as the RayCluster's own status tells (no pods listed): for listings."""
    status = obj.get("status") or {}
    workers_ready = int(status.get("readyWorkerReplicas") or 0) >= \
        int(status.get("desiredWorkerReplicas") or 0)
    if has_conditions(obj):
        return condition_true(obj, "RayClusterProvisioned") and \
            condition_true(obj, "HeadPodReady") and \
            not condition_true(obj, "ReplicaFailure") and workers_ready
    return status.get("state") == "ready" and workers_ready


def _live(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]
