"""Find and remove RayClusters that uniflow made and nobody needs any more.

A cluster is kept while its run is still running and its expiry annotation lies ahead. It is
garbage once its run has ended (succeeded, failed, interrupted), its run record is gone from
storage, or it expired: a driver killed with SIGKILL or a lost laptop leaves clusters that
no ``finally`` block will ever delete.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from michelangelo.uniflow.core.plugin import RunState, RunStore
from michelangelo.uniflow.plugins.ray.kuberay._kube import KubeApi
from michelangelo.uniflow.plugins.ray.kuberay._manifest import (
    EXPIRES_ANNOTATION,
    MANAGED_LABEL,
    RUN_LABEL,
    TASK_LABEL,
)
from michelangelo.uniflow.plugins.ray.kuberay._status import status_ready


@dataclass(frozen=True)
class ManagedCluster:
    """One RayCluster uniflow made, and whether it may be removed (``reason`` says why)."""

    namespace: str
    name: str
    run_id: str
    task: str
    created: str
    expires_at: float | None
    ready: bool
    garbage: bool
    reason: str


def managed_clusters(api: KubeApi, store: RunStore | None, *, namespace: str | None = None,
                     now: float | None = None) -> list[ManagedCluster]:
    """Every RayCluster labelled as uniflow's, with its run's state and its expiry."""
    now = time.time() if now is None else now
    out = []
    for obj in api.list("RayCluster", namespace, label_selector=f"{MANAGED_LABEL}=uniflow"):
        meta = obj["metadata"]
        labels = meta.get("labels") or {}
        run_id = labels.get(RUN_LABEL, "")
        expires = _float((meta.get("annotations") or {}).get(EXPIRES_ANNOTATION))
        garbage, reason = _verdict(run_id, expires, store, now)
        ready = status_ready(obj)
        out.append(ManagedCluster(meta.get("namespace", ""), meta["name"], run_id,
                                  labels.get(TASK_LABEL, ""), meta.get("creationTimestamp", ""),
                                  expires, ready, garbage, reason))
    return sorted(out, key=lambda c: (c.namespace, c.name))


def collect_garbage(api: KubeApi, store: RunStore | None, *, namespace: str | None = None,
                    dry_run: bool = False, now: float | None = None) -> list[ManagedCluster]:
    """Delete the clusters :func:`managed_clusters` marks as garbage; returns them."""
    removed = []
    for cluster in managed_clusters(api, store, namespace=namespace, now=now):
        if not cluster.garbage:
            continue
        if not dry_run:
            api.delete("RayCluster", cluster.name, cluster.namespace)
        removed.append(cluster)
    return removed


def _verdict(run_id: str, expires: float | None, store: RunStore | None,
             now: float) -> tuple[bool, str]:
    if expires is not None and expires <= now:
        return True, "expired"
    if store is None:
        return False, "run state unknown (no storage given)"
    record = store.load_run(run_id) if run_id else None
    if record is None:
        return True, "its run is not in storage"
    if record.state != RunState.RUNNING:
        return True, f"its run {record.state.value}"
    return False, "its run is still running"


def _float(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None
