"""The fit check counts what the scheduler will reserve for each pod KubeRay makes."""

from __future__ import annotations

from decimal import Decimal

import pytest

from michelangelo.uniflow.plugins.ray import RayTask
from michelangelo.uniflow.plugins.ray.kuberay import ray_cluster_manifest
from michelangelo.uniflow.plugins.ray.kuberay._fit import ClusterFitError, check_fit, pod_requests
from tests.uniflow.plugins.ray.kuberay._kuberay_rules import WAIT_GCS_READY_REQUESTS


def _node(name="node-1", cpu="1", memory="4Gi"):
    return {"metadata": {"name": name}, "spec": {},
            "status": {"allocatable": {"cpu": cpu, "memory": memory},
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def _small(workers):
    task = RayTask(head_cpu="100m", head_memory="128Mi", worker_cpu="100m",
                   worker_memory="128Mi", worker_instances=workers)
    return ray_cluster_manifest(task, name="uf-small", image="rayproject/ray:test")


def test_worker_pods_reserve_the_wait_gcs_ready_init_container():
    """KubeRay adds a ``wait-gcs-ready`` init container to every worker pod
    (``DefaultWorkerPodTemplate`` in ``controllers/ray/common/pod.go``, v1.7.0) with fixed
    requests; the scheduler reserves the larger of it and the pod's own containers."""
    pods = pod_requests(_small(2))
    assert pods[0] == ("head pod", {"cpu": Decimal("0.1"), "memory": Decimal(128 * 2**20)})
    for label, need in pods[1:]:
        assert label.startswith("worker pod")
        assert need == WAIT_GCS_READY_REQUESTS


def test_small_workers_that_only_fit_without_the_init_container_are_refused():
    # 1 CPU: head 100m + 5 workers x 100m fits, but each worker reserves 200m for its init
    # container, which 5 of them next to the head do not.
    with pytest.raises(ClusterFitError, match="all 6 pods together"):
        check_fit(_small(5), [_node()])
    check_fit(_small(4), [_node()])


def test_running_pods_hold_their_init_containers_requests_too():
    running = {"metadata": {"name": "other"}, "status": {"phase": "Running"},
               "spec": {"nodeName": "node-1",
                        "containers": [{"resources": {"requests": {"cpu": "50m"}}}],
                        "initContainers": [{"resources": {"requests": {"cpu": "600m"}}}]}}
    check_fit(_small(2), [_node()])
    with pytest.raises(ClusterFitError):
        check_fit(_small(2), [_node()], [running])
