"""A serving deployment as a KubeRay ``RayService``: its Serve config plus a RayTask cluster.

The deployment description is the same plain value the local ``deploy`` hands to Ray Serve
(``michelangelo.lib.serving``); here it becomes ``serveConfigV2``, with an HTTP proxy on every
pod, bound to all of the pod's interfaces (the Service in front of them decides who can reach
them). A
RayService outlives the run that made it: it carries no expiry, and ``clusters gc`` (which
removes run clusters) leaves it and the clusters KubeRay makes for it alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import yaml

from michelangelo.uniflow.core.errors import ClusterError
from michelangelo.uniflow.plugins.ray.kuberay._kube import KubeApi
from michelangelo.uniflow.plugins.ray.kuberay._manifest import (
    HEAD_PORTS,
    MANAGED_LABEL,
    check_kuberay_name,
    ray_cluster_manifest,
)
from michelangelo.uniflow.plugins.ray.kuberay._pod_diagnosis import (
    events_about,
    fatal_reason,
    last_words,
    pending_reasons,
)
from michelangelo.uniflow.plugins.ray.kuberay._provisioner import DEADLINE_ENV
from michelangelo.uniflow.plugins.ray.provisioning import RayTask

SERVING = "uniflow-serving"  # MANAGED_LABEL value of RayServices (run clusters: "uniflow")
_POLL_S = 1.0
# KubeRay 1.7 refuses longer RayService names (its RayCluster limit, 53, less a suffix of 6).
MAX_SERVICE_NAME = 47


def ray_service_manifest(serve_config: dict[str, Any], task: RayTask, *, name: str,
                         namespace: str = "default", image: str | None = None,
                         labels: dict[str, str] | None = None,
                         storage_secret: str | None = None,
                         working_dir: str | None = None,
                         serve_node_port: int | None = None,
                         auth: str = "disabled",
                         cpu_request_fraction: float = 1.0) -> dict[str, Any]:
    """A ``ray.io/v1`` ``RayService`` serving ``serve_config`` on a cluster shaped like ``task``.

    Args:
        serve_config: A Ray Serve config, e.g. ``DeploymentDescription.to_serve_config()``.
        task: The shape of the cluster that serves it.
        name: The RayService's name.
        namespace: Where it is created.
        image: Ray image of every node (default: this client's Ray and Python).
        labels: Extra labels.
        storage_secret: Secret with the storage credentials the replicas need to read weights.
        working_dir: A zip URI (``s3://``, ``gs://``, ``file://``) every application runs in,
            e.g. the project that defines the model factory.
        serve_node_port: Expose the Serve proxy on this NodePort (a host-mapped sandbox).
        auth: Ray's authentication on the serving cluster (see ``ray_cluster_manifest``);
            KubeRay then sends the cluster's token with the Serve config it submits.
        cpu_request_fraction: The share of each node's CPUs requested from Kubernetes (see
            ``ray_cluster_manifest``).

    Raises:
        ValueError: ``name`` is not a RayService name KubeRay accepts (a DNS-1035 label of
            at most 47 characters), or another field is invalid.
    """
    check_kuberay_name("deployment name", name, max_len=MAX_SERVICE_NAME, kind="RayService",
                       example="churn-model")
    cluster = ray_cluster_manifest(task, name=name, namespace=namespace, image=image,
                                   labels=labels, storage_secret=storage_secret, auth=auth,
                                   serving=True, cpu_request_fraction=cpu_request_fraction)
    config = dict(serve_config)
    config["http_options"] = {**config.get("http_options", {}), "host": "0.0.0.0",
                              "port": HEAD_PORTS["serve"]}
    # Serve's own default, and what KubeRay is built around: its serve Service sends traffic
    # to every worker pod whose own Serve proxy passes the readiness probe KubeRay gives it
    # (a proxy runs where replicas run). With a head-only proxy no worker pod would ever be
    # Ready and every request would pass through the head.
    config["proxy_location"] = "EveryNode"
    if working_dir:
        config["applications"] = [
            {**app, "runtime_env": {**app.get("runtime_env", {}), "working_dir": working_dir}}
            for app in config.get("applications", [])]
    spec: dict[str, Any] = {
        "serveConfigV2": yaml.safe_dump(config, sort_keys=False),
        "rayClusterConfig": cluster["spec"],
    }
    if serve_node_port is not None:
        spec["serveService"] = {"spec": {"type": "NodePort", "ports": [{
            "name": "serve", "port": HEAD_PORTS["serve"], "targetPort": HEAD_PORTS["serve"],
            "nodePort": serve_node_port}]}}
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayService",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {**cluster["metadata"]["labels"], MANAGED_LABEL: SERVING}},
        "spec": spec,
    }


def service_cluster(manifest: dict[str, Any]) -> dict[str, Any]:
    """The RayCluster a RayService manifest asks KubeRay for (for the fit check)."""
    return {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": manifest["metadata"],
            "spec": manifest["spec"]["rayClusterConfig"]}


def apply_ray_service(api: KubeApi, manifest: dict[str, Any]) -> dict[str, Any]:
    """Create the RayService, or update its spec in place (KubeRay then rolls it over)."""
    meta = manifest["metadata"]
    current = api.get("RayService", meta["name"], meta.get("namespace", "default"))
    if current is None:
        return api.create(manifest)
    updated = dict(manifest)
    updated["metadata"] = {**meta, "resourceVersion": current["metadata"]["resourceVersion"]}
    return api.replace(updated)


def service_ready(obj: dict[str, Any]) -> bool:
    """Serving the spec last written: KubeRay has seen it, is not upgrading, and every
    application of its Serve config is ``RUNNING`` on the active cluster.

    KubeRay's own ``Ready`` condition only says that serve endpoints exist, which stays true
    through a Serve-config-only update, so the applications are checked here too.
    """
    status = obj.get("status") or {}
    conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
    seen = status.get("observedGeneration", 0) >= obj["metadata"].get("generation", 0)
    pending = (status.get("pendingServiceStatus") or {}).get("rayClusterName")
    apps = (status.get("activeServiceStatus") or {}).get("applicationStatuses") or {}
    running = bool(apps) and all((app or {}).get("status") == "RUNNING" for app in apps.values())
    return seen and conditions.get("Ready") == "True" and not pending and running and \
        conditions.get("UpgradeInProgress") != "True" and _app_names(obj) <= set(apps)


def _app_names(obj: dict[str, Any]) -> set[str]:
    """The application names the RayService's Serve config asks for."""
    try:
        config = yaml.safe_load((obj.get("spec") or {}).get("serveConfigV2") or "") or {}
        return {str(app["name"]) for app in config.get("applications") or []}
    except (yaml.YAMLError, TypeError, KeyError, AttributeError):
        return set()


class _Rollout:
    """Which of a RayService's status writes can speak for the Serve config last applied.

    KubeRay reads the applications' statuses from the dashboard before it submits a changed
    Serve config, and writes them with the new ``observedGeneration`` in that same pass
    (``reconcileServe`` in ``rayservice_controller.go``). After an update that first write
    still shows the old applications, so only a later one counts; when nothing changes
    afterwards (an update Serve applied within one pass) the first one counts once it has
    stood for a few of KubeRay's 2 s passes.
    """

    SETTLE_S = 10.0

    def __init__(self, updated: bool) -> None:
        self.updated = updated
        self._first: tuple[str, float] | None = None

    def current(self, obj: dict[str, Any]) -> bool:
        status = obj.get("status") or {}
        if status.get("observedGeneration", 0) < obj["metadata"].get("generation", 0):
            return False
        if not self.updated:
            return True
        version = obj["metadata"].get("resourceVersion", "")
        if self._first is None:
            self._first = (version, time.monotonic())
            return False
        return version != self._first[0] or time.monotonic() - self._first[1] >= self.SETTLE_S


def service_status(obj: dict[str, Any]) -> str:
    """A one-line account of a RayService's state for the console."""
    status = obj.get("status") or {}
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    upgrading = (conditions.get("UpgradeInProgress") or {}).get("status") == "True"
    state = "ready" if service_ready(obj) else "upgrading" if upgrading else "not ready yet"
    apps = (status.get("activeServiceStatus") or {}).get("applicationStatuses") or {}
    details = ", ".join(f"{name} {(app or {}).get('status', '?')}" for name, app in apps.items())
    meta = obj["metadata"]
    return f"RayService {meta.get('namespace', 'default')}/{meta['name']}: {state}" + \
        (f" ({details})" if details else "")


def service_url(name: str, namespace: str, route: str = "/") -> str:
    """The endpoint inside the Kubernetes cluster (the Serve Service KubeRay makes)."""
    return f"http://{name}-serve-svc.{namespace}.svc:{HEAD_PORTS['serve']}{route}"


def wait_for_service(api: KubeApi, name: str, namespace: str, *, deadline_s: float,
                     on_progress: Callable[[str], None],
                     applied: dict[str, Any] | None = None,
                     updated: bool = False) -> dict[str, Any]:
    """Wait until the RayService serves its current spec; fail on pods that cannot start.

    Args:
        api: The Kubernetes API.
        name: The RayService.
        namespace: Its namespace.
        deadline_s: How long to wait.
        on_progress: Called with a line whenever the state changes.
        applied: The object as the API server returned it when the spec was written (its
            ``resourceVersion`` tells KubeRay's later verdicts from earlier ones).
        updated: The spec replaced an existing RayService's (the applications' statuses
            then speak for the new Serve config only once KubeRay has written them again).

    Raises:
        ClusterError: KubeRay refused the RayService (``ValidationFailed``), Serve could not
            deploy an application (``DEPLOY_FAILED``, with its message), a pod of its cluster
            cannot start, or the deadline passed (with the state it was in and the reasons
            its pods waited).
    """
    deadline = time.monotonic() + deadline_s
    last, seen = "", []
    rollout = _Rollout(updated)
    written = (applied or {}).get("metadata", {}).get("resourceVersion")
    while True:
        obj = api.get("RayService", name, namespace)
        if obj is None:
            raise ClusterError(f"RayService {namespace}/{name} was deleted while rolling out.")
        status = obj.get("status") or {}
        refused = _validation_failure(obj)
        if refused and obj["metadata"].get("resourceVersion") != written:
            raise ClusterError(f"KubeRay refused RayService {namespace}/{name}: {refused}. Fix "
                               "the deployment's name or spec and deploy again.")
        fresh = rollout.current(obj)
        clusters = {s.get("rayClusterName") for s in (status.get("activeServiceStatus"),
                                                      status.get("pendingServiceStatus")) if s}
        pods = [p for c in sorted(c for c in clusters if c)
                for p in api.pods(namespace, f"ray.io/cluster={c}")]
        reasons = pending_reasons(pods, events_about(api, namespace, pods, name))
        seen += [r for r in reasons if r not in seen]
        failed = _failed_application(status) if fresh else None
        if failed:
            raise ClusterError(f"RayService {namespace}/{name}: Serve could not deploy "
                               f"{failed}. Fix the revision or the deployment and deploy again.")
        fatal = fatal_reason(pods)
        if fatal:
            raise ClusterError(f"RayService {namespace}/{name} cannot start: {fatal}. Fix the "
                               "image or the deploying task's RayTask."
                               + last_words(api, namespace, pods))
        ready = fresh and service_ready(obj)
        # a ready service's line leaves out the warnings of its way there (they are in seen)
        line = service_status(obj) + (f" ({'; '.join(reasons)})" if reasons and not ready
                                      else "")
        if line != last:
            on_progress(line)
            last = line
        if ready:
            return obj
        if time.monotonic() > deadline:
            raise ClusterError(
                f"RayService {namespace}/{name} did not serve within {deadline_s:.0f}s "
                f"({DEADLINE_ENV}); last state: {service_status(obj)}. Reasons seen: "
                f"{'; '.join(seen) or 'none'}.")
        time.sleep(_POLL_S)


def _failed_application(status: dict[str, Any]) -> str | None:
    """``'app: message'`` for an application Serve gave up deploying, if any."""
    for side in ("pendingServiceStatus", "activeServiceStatus"):
        apps = (status.get(side) or {}).get("applicationStatuses") or {}
        for name, app in apps.items():
            if (app or {}).get("status") == "DEPLOY_FAILED":
                return f"{name}: {(app.get('message') or 'no message').strip()[-1500:]}"
    return None


def _validation_failure(obj: dict[str, Any]) -> str | None:
    """KubeRay's reason for refusing the RayService outright (its ``ValidationFailed``)."""
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready" and cond.get("reason") == "ValidationFailed":
            return cond.get("message") or "no message"
    return None
