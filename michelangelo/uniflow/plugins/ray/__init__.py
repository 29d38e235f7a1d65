"""Ray plugin for uniflow: ``RayTask`` clusters, capacity checks and Ray Train run configs.

The public face for workflows, the trainer, serving and the CLI. The standing cluster of
``michelangelo cluster up`` has its own public module, :mod:`.standing`. Extensions (KubeRay)
join the provisioner registries through the ``michelangelo.uniflow.plugins.ray`` entry point
group; this package never imports them.
"""

from michelangelo.uniflow.plugins.ray import _plugin  # noqa: F401  (registration)
from michelangelo.uniflow.plugins.ray._capacity import (
    CapacityError,
    ClusterShape,
    ResourcesUnavailableError,
    check_fits,
    current_ray_task,
    current_shape,
)
from michelangelo.uniflow.plugins.ray._clusters import (
    LocalRayCluster,
    load_extensions,
    register_provisioner,
    register_run_provisioner,
)
from michelangelo.uniflow.plugins.ray._task import RayTask, create_run_config

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
    "register_run_provisioner",
]

load_extensions()  # last: extensions import the names above
