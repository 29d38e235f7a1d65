"""KubeRay: ``RayTask`` clusters as ``ray.io/v1`` custom resources on Kubernetes."""

from michelangelo.uniflow.plugins.ray.kuberay._manifest import (
    container_resources,
    default_image,
    ray_cluster_manifest,
)

__all__ = ["container_resources", "default_image", "ray_cluster_manifest"]
