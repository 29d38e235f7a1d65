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


# -- the fit of a run's RayClusters together (concurrent branches under --kuberay) ----------
# Allocatable as a GKE e2-standard-8 node reports it (8 vCPU, 32 GB, some reserved).
E2_STANDARD_8 = {"cpu": "7910m", "memory": "29045876Ki", "ephemeral-storage": "47060071478"}


def _real_node(name):
    node = _node(name)
    node["status"]["allocatable"] = dict(E2_STANDARD_8)
    return node


def _branch(name, cpu=3, memory="10Gi", workers=1):
    task = RayTask(head_cpu=cpu, head_memory=memory, worker_cpu=cpu, worker_memory=memory,
                   worker_instances=workers)
    return ray_cluster_manifest(task, name=name, image="rayproject/ray:test")


def _pod_of(cluster, node_type, node, cpu, memory, group="headgroup"):
    return {"metadata": {"name": f"{cluster}-{node_type}",
                         "labels": {"ray.io/cluster": cluster, "ray.io/node-type": node_type,
                                    "ray.io/group": group}},
            "status": {"phase": "Running"},
            "spec": {"nodeName": node,
                     "containers": [{"resources": {"requests": {"cpu": cpu, "memory": memory}}}]}}


def test_a_branch_cluster_fits_next_to_the_runs_others_until_the_nodes_are_full():
    from michelangelo.uniflow.plugins.ray.kuberay._fit import fit_with_run

    nodes = [_real_node("pool-1"), _real_node("pool-2")]
    # Each branch's cluster: a head and a worker of 3 CPU, 10Gi: two per node at most.
    first, second, third = _branch("uf-a"), _branch("uf-b"), _branch("uf-c")
    assert fit_with_run(first, nodes, [], []).fits
    # The first cluster was just created: no pod of it exists yet, yet its room is taken.
    fit = fit_with_run(second, nodes, [], [first])
    assert fit.fits and fit.waits_for == ()
    # Its pods now run (one per node), the second has none yet: a third would need a
    # fifth and sixth 3-CPU pod on two nodes of 7.91 CPU that hold four.
    running = [_pod_of("uf-a", "head", "pool-1", "3", "10Gi"),
               _pod_of("uf-a", "worker", "pool-2", "3", "10Gi", group="workers")]
    fit = fit_with_run(third, nodes, running, [first, second])
    assert not fit.fits
    assert fit.waits_for == ("uf-a", "uf-b")
    assert fit.need == "cpu 6, memory 20Gi"
    assert fit.free.startswith("pool-1: cpu 1.91, memory ") and "; pool-2: cpu 1.91" in fit.free
    # Once the first has ended (its manifest gone, its pods too), the third fits.
    assert fit_with_run(third, nodes, [], [second]).fits


def test_pods_of_other_users_count_and_a_cluster_that_never_fits_fails_at_once():
    from michelangelo.uniflow.plugins.ray.kuberay._fit import fit_with_run

    nodes = [_real_node("pool-1"), _real_node("pool-2")]
    other_user = _pod_of("someone-else", "head", "pool-1", "6", "4Gi")
    fit = fit_with_run(_branch("uf-b"), nodes, [other_user], [_branch("uf-a")])
    assert not fit.fits and fit.waits_for == ("uf-a",)
    # 12 CPU per worker: no node will ever have that, whatever the run's clusters do.
    with pytest.raises(ClusterFitError) as err:
        fit_with_run(_branch("uf-huge", cpu=12), nodes, [other_user], [_branch("uf-a")])
    message = str(err.value)
    assert "asks for cpu 12" in message and "no node has that much free cpu" in message
    assert "Fix: shrink the RayTask's" in message


def test_how_many_branch_clusters_the_nodes_hold_at_once():
    from michelangelo.uniflow.plugins.ray.kuberay._fit import copies_that_fit, describe_free

    nodes = [_real_node("pool-1"), _real_node("pool-2")]
    assert copies_that_fit([_branch(f"uf-{i}") for i in range(5)], nodes, []) == 2
    small = [_branch(f"uf-{i}", cpu=1, memory="2Gi") for i in range(10)]
    assert copies_that_fit(small, nodes, []) == 7  # 7 pairs of 1-CPU pods on 15.82 CPU
    # A branch that can never fit is left out (it fails alone), the others still count.
    assert copies_that_fit([_branch("uf-huge", cpu=12), _branch("uf-a")], nodes, []) == 1
    busy = [_pod_of("someone-else", "head", "pool-1", "7", "1Gi")]
    assert copies_that_fit([_branch(f"uf-{i}") for i in range(5)], nodes, busy) == 1
    assert describe_free(nodes, busy).startswith("cpu 8.82, memory")
