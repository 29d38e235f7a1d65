"""A serving deployment as a KubeRay ``RayService``: its Serve config plus a RayTask cluster.

The deployment description is the same plain value the local ``deploy`` hands to Ray Serve
(``michelangelo.lib.serving``); here it becomes ``serveConfigV2``, with the HTTP proxy bound to
every interface of the head pod (the Service in front of it decides who can reach it).
"""

from __future__ import annotations

from typing import Any

import yaml

from michelangelo.uniflow.plugins.ray._config import RayTask
from michelangelo.uniflow.plugins.ray.kuberay._kube import KubeApi
from michelangelo.uniflow.plugins.ray.kuberay._manifest import HEAD_PORTS, ray_cluster_manifest


def ray_service_manifest(serve_config: dict[str, Any], task: RayTask, *, name: str,
                         namespace: str = "default", image: str | None = None,
                         labels: dict[str, str] | None = None,
                         storage_secret: str | None = None) -> dict[str, Any]:
    """A ``ray.io/v1`` ``RayService`` serving ``serve_config`` on a cluster shaped like ``task``.

    Args:
        serve_config: A Ray Serve config, e.g. ``DeploymentDescription.to_serve_config()``.
        task: The shape of the cluster that serves it.
        name: The RayService's name.
        namespace: Where it is created.
        image: Ray image of every node (default: this client's Ray and Python).
        labels: Extra labels.
        storage_secret: Secret with the storage credentials the replicas need to read weights.
    """
    cluster = ray_cluster_manifest(task, name=name, namespace=namespace, image=image,
                                   labels=labels, storage_secret=storage_secret)
    config = dict(serve_config)
    config["http_options"] = {**config.get("http_options", {}), "host": "0.0.0.0",
                              "port": HEAD_PORTS["serve"]}
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayService",
        "metadata": cluster["metadata"],
        "spec": {
            "serveConfigV2": yaml.safe_dump(config, sort_keys=False),
            "rayClusterConfig": cluster["spec"],
        },
    }


def apply_ray_service(api: KubeApi, manifest: dict[str, Any]) -> dict[str, Any]:
    """Create the RayService, or update its spec in place (KubeRay then rolls it over)."""
    meta = manifest["metadata"]
    current = api.get("RayService", meta["name"], meta.get("namespace", "default"))
    if current is None:
        return api.create(manifest)
    updated = dict(manifest)
    updated["metadata"] = {**meta, "resourceVersion": current["metadata"]["resourceVersion"]}
    return api.replace(updated)


def service_status(obj: dict[str, Any]) -> str:
    """A one-line account of a RayService's state for the console."""
    status = obj.get("status") or {}
    conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
    ready = conditions.get("Ready") == "True"
    upgrading = conditions.get("UpgradeInProgress") == "True"
    name = obj["metadata"]["name"]
    state = "ready" if ready else "upgrading" if upgrading else "not ready yet"
    return f"RayService {obj['metadata'].get('namespace', 'default')}/{name}: {state}; " \
           f"endpoint http://{name}-serve-svc:{HEAD_PORTS['serve']}/"
