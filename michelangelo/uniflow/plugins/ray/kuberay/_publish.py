"""The endpoints a ``--kuberay`` task deployed, made lasting ``RayService`` objects.

Runs on the client after the task's job succeeded, so Kubernetes credentials never reach a
cluster: each deployment the task recorded (its description travels back in the task's
artifacts) is rendered with the deploying task's RayTask shape, fit-checked, applied, and
waited for.
"""

from __future__ import annotations

import os
from typing import Any

from michelangelo.uniflow.core.plugin import Run
from michelangelo.uniflow.plugins.ray.kuberay._fit import ClusterFitError, check_fit
from michelangelo.uniflow.plugins.ray.kuberay._kube import KubeApi
from michelangelo.uniflow.plugins.ray.kuberay._manifest import HEAD_PORTS, LABEL_PREFIX
from michelangelo.uniflow.plugins.ray.kuberay._provisioner import label_value
from michelangelo.uniflow.plugins.ray.kuberay._service import (
    apply_ray_service,
    ray_service_manifest,
    service_cluster,
    service_status,
    service_url,
    wait_for_service,
)
from michelangelo.uniflow.plugins.ray.provisioning import RayTask


def publish(clusters: Any, deployments: list[dict[str, Any]], config: RayTask,
            call_id: str, project: Any) -> None:
    """Apply and wait for a RayService per deployment (the last one of each name).

    Args:
        clusters: The run's ``RunClusters`` (its run, settings and clusters).
        deployments: The task's ``deployment`` artifacts, each with its ``_description``.
        config: The deploying task's RayTask: the shape of each service's cluster.
        call_id: The task call the services are recorded under.
        project: The run's packed project (its zip becomes the applications' working_dir).
    """
    from michelangelo.lib.serving import DeploymentDescription

    latest = {d["_description"]["name"]: d["_description"] for d in deployments}
    if not latest:
        return
    api = KubeApi(clusters.settings.target)
    working_dir = _upload_project(clusters.run, project) if project is not None else None
    for raw in latest.values():
        _publish_one(clusters, api, DeploymentDescription.from_dict(raw), config, call_id,
                     working_dir)


def _publish_one(clusters: Any, api: KubeApi, description: Any, config: RayTask,
                 call_id: str, working_dir: str | None) -> None:
    run, settings, name = clusters.run, clusters.settings, description.name
    namespace = settings.namespace
    node_port = settings.serve_node_port
    holder = _node_port_holder(api, namespace, node_port, name)
    if holder:
        run.info(f"RayService {holder} already holds node port {node_port} "
                 f"(127.0.0.1:{HEAD_PORTS['serve']}); {name} is reachable inside the cluster "
                 "only")
        node_port = None
    manifest = ray_service_manifest(
        description.to_serve_config(), config, name=name, namespace=namespace,
        image=settings.image, storage_secret=settings.storage_secret,
        labels={f"{LABEL_PREFIX}/model": label_value(
                    f"{description.project_name}.{description.model_name}"),
                f"{LABEL_PREFIX}/revision": str(description.revision_id)},
        working_dir=working_dir, serve_node_port=node_port, auth=settings.auth,
        cpu_request_fraction=settings.cpu_request_fraction)
    exists = api.get("RayService", name, namespace) is not None
    if not exists and settings.fit_check:
        try:
            check_fit(service_cluster(manifest), api.nodes(), api.all_pods())
        except ClusterFitError:
            # The task is done with its cluster; the endpoint needs the room.
            if not clusters.make_room(call_id):
                raise
            check_fit(service_cluster(manifest), api.nodes(), api.all_pods())
    spec = f"{description.project_name}/{description.model_name}:{description.revision_id}"
    applied = apply_ray_service(api, manifest)
    run.info(f"RayService {namespace}/{name}: {'updating to' if exists else 'creating with'} "
             f"{spec}")
    with run.status(f"RayService {namespace}/{name}: rolling out {spec}"):
        obj = wait_for_service(api, name, namespace, deadline_s=settings.deadline(),
                               on_progress=run.info, applied=applied, updated=exists)
    url = service_url(name, namespace, description.route_prefix)
    outside = (f"http://127.0.0.1:{HEAD_PORTS['serve']}{description.route_prefix}"
               if node_port else None)
    run.info(f"{service_status(obj)}; endpoint {url}"
             + (f" (from this machine: {outside})" if outside else ""))
    run.add_artifact(call_id, {"kind": "rayservice", "name": name, "namespace": namespace,
                               "spec": spec, "url": url,
                               **({"local_url": outside} if outside else {})})


def _node_port_holder(api: Any, namespace: str, node_port: int | None,
                      name: str) -> str | None:
    """Another RayService whose Serve Service already claims ``node_port``, if any."""
    if node_port is None:
        return None
    for other in api.list("RayService", namespace):
        ports = ((other["spec"].get("serveService") or {}).get("spec") or {}).get("ports") or []
        if other["metadata"]["name"] != name and any(p.get("nodePort") == node_port
                                                     for p in ports):
            return f"{namespace}/{other['metadata']['name']}"
    return None


def _upload_project(run: Run, project: Any) -> str:
    """The run's project zip in storage, as a URI every RayService node can fetch."""
    import hashlib

    with open(project.zip_path, "rb") as handle:
        data = handle.read()
    digest = hashlib.sha256(data).hexdigest()[:16]
    path = run.storage.join("serving", "projects", f"{digest}.zip")
    if not run.storage.exists(path):
        run.storage.write_bytes(path, data)
    url = run.storage.url_of(path)
    return url if "://" in url else f"file://{os.path.abspath(url)}"
