"""Ray plugin for uniflow: ``RayTask`` clusters, capacity checks and Ray Train run configs.

The public face for workflows, the trainer, serving and the CLI. The standing cluster of
``michelangelo cluster up`` has its own public module, :mod:`.standing`.
"""

from michelangelo.uniflow.plugins.ray import _dataset_io, _plugin  # noqa: F401  (registrations)
from michelangelo.uniflow.plugins.ray._capacity import (
    CapacityError,
    ClusterShape,
    ResourcesUnavailableError,
    check_fits,
    current_ray_task,
    current_shape,
)
from michelangelo.uniflow.plugins.ray._config import RayTask
from michelangelo.uniflow.plugins.ray._local import LocalRayCluster
from michelangelo.uniflow.plugins.ray._provisioners import register_provisioner
from michelangelo.uniflow.plugins.ray._run_config import create_run_config
from michelangelo.uniflow.plugins.ray.kuberay import _dispatch  # noqa: F401  (--kuberay)

__all__ = [
    "CapacityError",
    "ClusterShape",
    "LocalRayCluster",
    "RayTask",
    "ResourcesUnavailableError",
    "check_fits",
    "create_run_config",
    "current_ray_task",
    "current_shape",
    "register_provisioner",
]
