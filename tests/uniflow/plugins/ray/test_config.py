import dataclasses

import pytest

from michelangelo.uniflow.plugins.ray import RayTask


def test_quantities_are_parsed_once_at_construction():
    task = RayTask(head_cpu="500m", head_memory="8Gi", worker_memory="512Mi",
                   worker_disk="2G", worker_object_store_memory=100 * 2**20, worker_gpu=1,
                   worker_instances=2)
    assert task.parsed("head_cpu") == 0.5
    assert task.parsed("head_memory") == 8 * 2**30
    assert task.parsed("worker_memory") == 512 * 2**20
    assert task.parsed("worker_disk") == 2 * 10**9
    assert task.parsed("worker_gpu") == 1
    assert task.parsed("worker_object_store_memory") == 100 * 2**20


def test_ray_task_is_frozen_and_hashable_by_value():
    task = RayTask(worker_instances=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        task.worker_instances = 3
    assert task == RayTask(worker_instances=1)


@pytest.mark.parametrize(
    "kwargs, field, value",
    [
        ({"head_memory": "8GB"}, "head_memory", "8GB"),
        ({"worker_memory": "-1Gi"}, "worker_memory", "-1Gi"),
        ({"worker_cpu": "four"}, "worker_cpu", "four"),
        ({"worker_gpu": 0.5}, "worker_gpu", "0.5"),
        ({"worker_instances": 1.5}, "worker_instances", "1.5"),
        ({"worker_instances": -1}, "worker_instances", "-1"),
        ({"head_object_store_memory": "10Mi"}, "head_object_store_memory", "10Mi"),
        ({"worker_memory": "1Gi", "worker_object_store_memory": "2Gi"},
         "worker_object_store_memory", "2Gi"),
        ({"runtime_env": ["pip"]}, "runtime_env", "pip"),
    ],
)
def test_bad_values_name_field_and_value(kwargs, field, value):
    with pytest.raises(ValueError) as info:
        RayTask(**kwargs)
    assert field in str(info.value) and value in str(info.value)
