"""How the client reads a RayCluster as the real KubeRay 1.7 operator writes its status.

The status shapes below follow ``calculateStatus`` in
``ray-operator/controllers/ray/raycluster_controller.go`` (tag ``ray-operator/v1.7.0``):
``RayClusterProvisioned`` turns True once every pod that exists runs and is ready, without
counting them; ``ReplicaFailure`` carries the API server's refusal of a pod; with the
``RayClusterStatusConditions`` feature gate off only ``state`` (and the replica counts) are
written. The end-to-end path against a control plane is in ``tests/uniflow/plugins/ray/kuberay/bed``.
"""

from __future__ import annotations

from typing import Any

import pytest

from michelangelo.uniflow.core.errors import ClusterError
from michelangelo.uniflow.plugins.ray import RayTask
from michelangelo.uniflow.plugins.ray.kuberay._gc import managed_clusters
from michelangelo.uniflow.plugins.ray.kuberay._provisioner import (
    KubeRayCluster,
    KubeRaySettings,
)
from michelangelo.uniflow.plugins.ray.kuberay._status import (
    head_ready,
    pods_ready,
    refused_pods,
    status_ready,
)

QUOTA = ('pods "uf-x-workers-worker-abcde" is forbidden: exceeded quota: compute, requested: '
         "cpu=2, used: cpu=3, limited: cpu=4")


def _cond(kind: str, status: str, reason: str = "", message: str = "") -> dict[str, Any]:
    return {"type": kind, "status": status, "reason": reason or kind, "message": message}


def _pod(name: str, node_type: str, ready: bool = True) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"ray.io/node-type": node_type}},
            "spec": {"nodeName": "node-1"},
            "status": {"phase": "Running", "podIP": "10.0.0.9",
                       "conditions": [{"type": "Ready", "status": str(ready)}]}}


def _refused_workers(name: str = "uf-x") -> dict[str, Any]:
    """The head runs, both worker pods were refused by a ResourceQuota: what KubeRay writes."""
    return {"metadata": {"name": name, "namespace": "default",
                         "labels": {"uniflow.michelangelo.ai/managed-by": "uniflow"}},
            "status": {"conditions": [
                _cond("ReplicaFailure", "True", "FailedCreateWorkerPod", QUOTA),
                _cond("HeadPodReady", "True", "HeadPodRunningAndReady"),
                _cond("RayClusterProvisioned", "True", "AllPodRunningAndReadyFirstTime")],
                "desiredWorkerReplicas": 2, "readyWorkerReplicas": 0}}


def test_provisioned_is_not_ready_until_every_pod_exists():
    obj = _refused_workers()
    obj["status"]["conditions"] = obj["status"]["conditions"][1:]  # no ReplicaFailure
    head = [_pod("uf-x-head", "head")]
    assert head_ready(obj, head)
    assert not pods_ready(obj, head, expected=3)
    workers = [_pod("w1", "worker"), _pod("w2", "worker")]
    assert pods_ready(obj, head + workers, expected=3)
    assert not pods_ready(obj, head + workers[:1] + [_pod("w2", "worker", ready=False)], 3)


def test_replica_failure_is_the_reason():
    assert refused_pods(_refused_workers(), []) == f"FailedCreateWorkerPod: {QUOTA}"
    assert not pods_ready(_refused_workers(), [_pod("h", "head"), _pod("w1", "worker"),
                                               _pod("w2", "worker")], expected=3)


def test_without_status_conditions_state_and_pods_decide():
    """The ``RayClusterStatusConditions`` gate off: no conditions, ``state: ready`` once all
    ``desired + 1`` pods run (``calculateStatus``), and pod readiness."""
    obj = {"metadata": {"name": "uf-x"}, "status": {"state": "ready", "desiredWorkerReplicas": 1,
                                                    "readyWorkerReplicas": 1}}
    pods = [_pod("uf-x-head", "head"), _pod("w1", "worker")]
    assert head_ready(obj, pods)
    assert pods_ready(obj, pods, expected=2)
    assert status_ready(obj)
    assert not pods_ready({"metadata": {"name": "uf-x"}, "status": {}}, pods, expected=2)
    event = {"type": "Warning", "reason": "FailedToCreateWorkerPod", "message": QUOTA,
             "involvedObject": {"kind": "RayCluster", "name": "uf-x"}}
    assert refused_pods({"metadata": {"name": "uf-x"}, "status": {}}, [event]) == \
        f"FailedToCreateWorkerPod: {QUOTA}"


class _KubeApiDouble:
    """TEST DOUBLE of ``KubeApi``: one RayCluster whose status and pods are fixed, as the
    real operator leaves them when a quota refuses the worker pods."""

    def __init__(self, status: dict[str, Any], pods: list[dict[str, Any]]) -> None:
        self.status, self._pods, self.created = status, pods, None

    def create(self, manifest: dict[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
        if not dry_run:
            self.created = manifest
        return manifest

    def get(self, kind: str, name: str, namespace: str) -> dict[str, Any] | None:
        return {**self.created, "status": self.status} if self.created else None

    def pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        return self._pods

    def events(self, namespace: str) -> list[dict[str, Any]]:
        return []


def test_refused_worker_pods_fail_the_start_at_once_with_the_reason():
    api = _KubeApiDouble(_refused_workers()["status"], [_pod("uf-x-head", "head")])
    task = RayTask(head_cpu=1, worker_cpu=2, worker_instances=2)
    cluster = KubeRayCluster(task, run_id="20261201-000000-abcdef", task_name="train",
                             settings=KubeRaySettings(fit_check=False, deadline_s=3,
                                                      head_address="http://127.0.0.1:9"),
                             api=api)
    with pytest.raises(ClusterError, match="could not create its pods: FailedCreateWorkerPod: "
                                           "pods .* is forbidden: exceeded quota"):
        cluster.start()


@pytest.mark.parametrize("access, label", [
    ("port-forward", "--head-access port-forward: "),
    ("auto", "--head-access auto (the head pod's address did not answer from here): "),
])
def test_a_refused_port_forward_says_how_the_forward_was_chosen(access, label):
    cluster = KubeRayCluster(RayTask(head_cpu=1), run_id="20261201-000000-abcdef",
                             task_name="train", settings=KubeRaySettings(head_access=access),
                             api=_KubeApiDouble({}, []))
    message = cluster._forward_refused("was refused: Forbidden", made=True)
    assert message.startswith(label), message
    assert f"RayCluster {cluster.name!r}'s head was refused: Forbidden" in message
    assert "the cluster is being deleted" in message
    assert "granted 'create' on pods/portforward in namespace 'default'" in message


class _ListApiDouble:
    def __init__(self, items: list[dict[str, Any]]) -> None:
        self.items = items

    def list(self, kind: str, namespace: str | None, label_selector: str = "") -> list[dict]:
        return self.items


def test_clusters_list_does_not_call_a_cluster_with_refused_workers_ready():
    [listed] = managed_clusters(_ListApiDouble([_refused_workers()]), None)
    assert not listed.ready
    obj = _refused_workers()
    obj["status"]["conditions"] = obj["status"]["conditions"][1:]
    obj["status"]["readyWorkerReplicas"] = 2
    [listed] = managed_clusters(_ListApiDouble([obj]), None)
    assert listed.ready
