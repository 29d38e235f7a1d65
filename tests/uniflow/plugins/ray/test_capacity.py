"""Placement of Ray Train workers onto declared nodes, without starting anything."""

import pytest
from ray.train import ScalingConfig

from michelangelo.uniflow.plugins.ray import CapacityError, RayTask

SPEC = RayTask(head_cpu=2, head_memory="8Gi", worker_cpu=4, worker_memory="16Gi",
               worker_instances=4)


def test_the_guides_example_is_caught_with_both_sides_and_a_fix():
    with pytest.raises(CapacityError) as info:
        SPEC.check(ScalingConfig(num_workers=8, resources_per_worker={"CPU": 4}))
    text = str(info.value)
    assert "num_workers=8" in text and "4 x worker: 4 CPU" in text
    assert "can place only 4" in text and "lower num_workers to 4" in text


def test_per_node_misfit_is_caught_although_the_total_fits():
    with pytest.raises(CapacityError, match="cannot span nodes") as info:
        SPEC.check(ScalingConfig(num_workers=2, resources_per_worker={"CPU": 6}))
    assert "largest node has 4" in str(info.value)


def test_gpu_request_on_a_gpu_less_shape():
    with pytest.raises(CapacityError, match="declares no GPU"):
        SPEC.check(ScalingConfig(num_workers=1, use_gpu=True))


def test_memory_is_part_of_the_placement():
    with pytest.raises(CapacityError, match="memory"):
        SPEC.check(ScalingConfig(num_workers=4, resources_per_worker={"CPU": 1,
                                                                       "memory": 20 * 2**30}))


@pytest.mark.parametrize(
    "scaling",
    [
        ScalingConfig(num_workers=4, resources_per_worker={"CPU": 4}),
        ScalingConfig(num_workers=9, resources_per_worker={"CPU": 2}),  # head holds one
        ScalingConfig(num_workers=0),
        ScalingConfig(num_workers=(2, 16), resources_per_worker={"CPU": 4}),
    ],
)
def test_fitting_configs_pass(scaling):
    SPEC.check(scaling)


def test_gpus_fit_when_declared():
    RayTask(worker_cpu=8, worker_gpu=2, worker_instances=2).check(
        ScalingConfig(num_workers=4, use_gpu=True, resources_per_worker={"CPU": 4}))
    with pytest.raises(CapacityError):
        RayTask(worker_cpu=8, worker_gpu=2, worker_instances=2).check(
            ScalingConfig(num_workers=5, use_gpu=True))


def test_capacity_error_is_a_value_error_that_pickles():
    import pickle

    err = CapacityError("too big")
    assert isinstance(err, ValueError)
    assert str(pickle.loads(pickle.dumps(err))) == "too big"


def test_existing_cluster_placement_is_exact_not_first_fit():
    # A first fit puts the small head on the first 2-CPU node and then has no room for the
    # second worker; the live cluster (head listed last) holds the RayTask exactly.
    from michelangelo.uniflow.plugins.ray._capacity._shapes import (
        ClusterShape,
        NodeShape,
        check_holds,
        unplaced_node,
    )

    gib = 2**30
    live = ClusterShape((NodeShape("a", {"CPU": 2.0, "memory": 2.0 * gib}),
                         NodeShape("b", {"CPU": 2.0, "memory": 2.0 * gib}),
                         NodeShape("head", {"CPU": 1.0, "memory": 2.0 * gib})), "live")
    task = RayTask(head_cpu=1, head_memory="2Gi", worker_cpu=2, worker_memory="2Gi",
                   worker_instances=2)
    check_holds(task, live, where="test", fix="none")
    bigger = RayTask(head_cpu=1, worker_cpu=2, worker_instances=3)
    assert unplaced_node(ClusterShape.from_ray_task(bigger).nodes, live.nodes).name == "worker-2"
