"""Ray plugin for uniflow: ``RayTask`` clusters, capacity checks and Ray Train run configs."""

from michelangelo.uniflow.plugins.ray import _dataset_io, _plugin  # noqa: F401  (registrations)
from michelangelo.uniflow.plugins.ray._capacity import CapacityError, ResourcesUnavailableError
from michelangelo.uniflow.plugins.ray._config import RayTask
from michelangelo.uniflow.plugins.ray._provisioners import register_provisioner
from michelangelo.uniflow.plugins.ray._run_config import create_run_config
from michelangelo.uniflow.plugins.ray.kuberay import _dispatch  # noqa: F401  (--kuberay)

__all__ = [
    "CapacityError",
    "RayTask",
    "ResourcesUnavailableError",
    "create_run_config",
    "register_provisioner",
]
