"""What a cluster provisioner builds on: the cluster interface, node shapes and the registries.

The public face for extensions of the Ray plugin that make clusters (KubeRay is one), and
for whatever starts servers beside them (:func:`free_port`: a loopback port outside Ray's
worker ports and the kernel's ephemeral range, so nothing takes it before it is bound). A
provisioner subclasses :class:`RayCluster` and joins a registry: :func:`register_provisioner`
for clusters made per RayTask (chosen with ``UF_RAY_PROVISIONER``), or
:func:`register_run_provisioner` for remote runs whose options ask for it (``--kuberay``).
The plugin finds extensions through the ``michelangelo.uniflow.plugins.ray`` entry point
group (:data:`ENTRY_POINT_GROUP`), so it never imports them.

Typical use::

    from michelangelo.uniflow.plugins.ray.provisioning import RayCluster, register_provisioner

    class MyCluster(RayCluster):
        ...

    register_provisioner("mine", lambda task, log_dir: MyCluster(task, log_dir))
"""

from michelangelo.quantity import format_bytes, parse_quantity
from michelangelo.uniflow.plugins.ray._clusters import (
    ENTRY_POINT_GROUP,
    ClusterState,
    RayCluster,
    RunClusters,
    free_port,
    register_provisioner,
    register_run_provisioner,
)
from michelangelo.uniflow.plugins.ray._task import NodeResources, RayTask, node_resources

__all__ = [
    "ENTRY_POINT_GROUP",
    "ClusterState",
    "NodeResources",
    "RayCluster",
    "RayTask",
    "RunClusters",
    "format_bytes",
    "free_port",
    "node_resources",
    "parse_quantity",
    "register_provisioner",
    "register_run_provisioner",
]
