"""KubeRay: ``RayTask`` clusters as ``ray.io/v1`` custom resources on Kubernetes.

The Ray plugin loads this package through its entry point group; importing it registers the
``--kuberay`` run options and the KubeRay run provisioner.
"""

from michelangelo.uniflow.plugins.ray.kuberay import _dispatch  # noqa: F401  (registration)
from michelangelo.uniflow.plugins.ray.kuberay._fit import ClusterFitError
from michelangelo.uniflow.plugins.ray.kuberay._gc import collect_garbage, managed_clusters
from michelangelo.uniflow.plugins.ray.kuberay._kube import KubeApi, KubeError, KubeTarget
from michelangelo.uniflow.plugins.ray.kuberay._manifest import (
    container_resources,
    default_image,
    ray_cluster_manifest,
)
from michelangelo.uniflow.plugins.ray.kuberay._service import (
    apply_ray_service,
    ray_service_manifest,
)

__all__ = [
    "ClusterFitError",
    "KubeApi",
    "KubeError",
    "KubeTarget",
    "apply_ray_service",
    "collect_garbage",
    "container_resources",
    "default_image",
    "managed_clusters",
    "ray_cluster_manifest",
    "ray_service_manifest",
]
