"""TEST DOUBLE of the KubeRay operator's RayService controller (1.7), at its boundary:
RayService objects in; a RayCluster, the Serve config submitted to its dashboard, a
``<name>-serve-svc`` Service and the status KubeRay documents out, through the real API server.

As KubeRay does: a RayService gets a RayCluster named ``<name>-raycluster-<suffix>`` from its
``rayClusterConfig`` (owned by it, labelled ``ray.io/originated-from-crd``); once that
cluster's head is ready, ``serveConfigV2`` goes to the dashboard's Serve REST API
(``PUT /api/serve/applications/``), the statuses read before it as KubeRay reads them; when
every application is ``RUNNING`` the service is ``Ready``. A changed Serve config alone is
applied in place; a changed cluster config gets a new pending cluster (``UpgradeInProgress``) that replaces the active one once it serves.
The one liberty: Serve's ``0.0.0.0`` means every interface of the pod, and here a pod is a
loopback address, so the proxy binds the head pod's own address instead.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
import urllib.request
import uuid
from typing import Any

import yaml
from kubernetes import client

_HASH = "ray.io/hash-without-replicas-and-workers-to-delete"


def _digest(value: Any) -> str:
    return hashlib.sha1(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class RayServiceControllerDouble:
    def __init__(self, core: client.CoreV1Api, custom: client.CustomObjectsApi,
                 namespace: str) -> None:
        self._core = core
        self._custom = custom
        self.namespace = namespace
        self._submitted: dict[str, str] = {}  # cluster -> digest of the Serve config it got

    def reconcile_all(self) -> None:
        for service in self._list("rayservices"):
            if service["metadata"].get("deletionTimestamp"):
                self._collect(service)
            else:
                self._reconcile(service)

    # -- plumbing ------------------------------------------------------------------------------
    def _list(self, plural: str, selector: str = "") -> list[dict[str, Any]]:
        return self._custom.list_namespaced_custom_object(
            "ray.io", "v1", self.namespace, plural, label_selector=selector)["items"]

    def _cluster(self, name: str | None) -> dict[str, Any] | None:
        if not name:
            return None
        with contextlib.suppress(client.ApiException):
            return self._custom.get_namespaced_custom_object(
                "ray.io", "v1", self.namespace, "rayclusters", name)
        return None

    def _delete_cluster(self, name: str) -> None:
        self._submitted.pop(name, None)
        with contextlib.suppress(client.ApiException):
            self._custom.delete_namespaced_custom_object(
                "ray.io", "v1", self.namespace, "rayclusters", name,
                propagation_policy="Foreground")

    # -- reconcile -----------------------------------------------------------------------------
    def _reconcile(self, service: dict[str, Any]) -> None:
        meta, spec = service["metadata"], service["spec"]
        status = dict(service.get("status") or {})
        want = _digest(spec["rayClusterConfig"])
        active = self._cluster((status.get("activeServiceStatus") or {}).get("rayClusterName"))
        pending = self._cluster((status.get("pendingServiceStatus") or {}).get("rayClusterName"))
        if pending is None and (active is None or
                                (active["metadata"].get("annotations") or {}).get(_HASH) != want):
            pending = self._create_cluster(service, want)
        target = pending or active
        assert target is not None
        apps = self._serve(target, spec["serveConfigV2"])
        running = bool(apps) and all(a.get("status") == "RUNNING" for a in apps.values())
        if pending is not None and running:  # the new cluster serves: switch, drop the old
            if active is not None:
                self._delete_cluster(active["metadata"]["name"])
            active, pending = pending, None
        if active is not None and pending is None:
            self._serve_service(service, active["metadata"]["name"])
        statuses = {name: {"status": a.get("status", ""), "message": a.get("message") or
                           f"{name} is {a.get('status', '')}"} for name, a in apps.items()}
        ready = active is not None and running and pending is None
        new = {
            "observedGeneration": meta.get("generation", 1),  # as calculateStatus, every pass
            "numServeEndpoints": 1 if ready else 0,
            "conditions": [
                self._condition(status, "Ready", ready, "NonZeroServeEndpoints" if ready
                                else "Initializing"),
                self._condition(status, "UpgradeInProgress", pending is not None and
                                active is not None, "PendingClusterExists" if pending
                                else "NoPendingCluster"),
            ],
        }
        if active is not None:
            new["activeServiceStatus"] = {"rayClusterName": active["metadata"]["name"],
                                          **({"applicationStatuses": statuses}
                                             if pending is None else {})}
        if pending is not None:
            new["pendingServiceStatus"] = {"rayClusterName": pending["metadata"]["name"],
                                           "applicationStatuses": statuses}
        if {k: v for k, v in status.items() if k != "lastUpdateTime"} != new:
            self._custom.patch_namespaced_custom_object_status(
                "ray.io", "v1", self.namespace, "rayservices", meta["name"],
                {"status": {**new, "lastUpdateTime": _now(),
                            **({} if pending is not None else {"pendingServiceStatus": None})}})

    def _condition(self, status: dict[str, Any], kind: str, ok: bool,
                   reason: str) -> dict[str, Any]:
        value = "True" if ok else "False"
        old = {c["type"]: c for c in status.get("conditions") or []}.get(kind)
        since = old["lastTransitionTime"] if old and old["status"] == value else _now()
        return {"type": kind, "status": value, "reason": reason,
                "message": f"{kind} is {value}", "lastTransitionTime": since}

    def _create_cluster(self, service: dict[str, Any], digest: str) -> dict[str, Any]:
        meta = service["metadata"]
        name = f"{meta['name']}-raycluster-{uuid.uuid4().hex[:5]}"
        body = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {
            "name": name, "annotations": {_HASH: digest},
            "labels": {**(meta.get("labels") or {}), "ray.io/originated-from-crd": "RayService",
                       "ray.io/originated-from-cr-name": meta["name"]},
            "ownerReferences": [{"apiVersion": "ray.io/v1", "kind": "RayService",
                                 "name": meta["name"], "uid": meta["uid"], "controller": True,
                                 "blockOwnerDeletion": True}]},
            "spec": service["spec"]["rayClusterConfig"]}
        return self._custom.create_namespaced_custom_object(
            "ray.io", "v1", self.namespace, "rayclusters", body)

    def _serve(self, cluster: dict[str, Any], serve_config_v2: str) -> dict[str, Any]:
        """Submit the Serve config once the head is ready; the applications' statuses."""
        conditions = {c["type"]: c["status"]
                      for c in (cluster.get("status") or {}).get("conditions") or []}
        ip = ((cluster.get("status") or {}).get("head") or {}).get("podIP")
        if conditions.get("HeadPodReady") != "True" or not ip:
            return {}
        name, dashboard = cluster["metadata"]["name"], f"http://{ip}:8265"
        config = yaml.safe_load(serve_config_v2)
        config.setdefault("http_options", {})["host"] = ip  # a pod's 0.0.0.0 (see above)
        digest = _digest(config)
        # As KubeRay's reconcileServe: the statuses are read before a changed config is
        # submitted, so the pass that submits it still reports the old applications.
        try:
            with urllib.request.urlopen(f"{dashboard}/api/serve/applications/",
                                        timeout=10) as response:
                apps = json.loads(response.read()).get("applications") or {}
        except (OSError, ValueError):
            return {}  # the dashboard is still starting: next pass
        if self._submitted.get(name) != digest:
            request = urllib.request.Request(
                f"{dashboard}/api/serve/applications/", data=json.dumps(config).encode(),
                method="PUT", headers={"Content-Type": "application/json"})
            try:
                urllib.request.urlopen(request, timeout=60).close()
            except OSError:
                return {}
            self._submitted[name] = digest
        return apps

    def _serve_service(self, service: dict[str, Any], cluster: str) -> None:
        meta = service["metadata"]
        body = {"apiVersion": "v1", "kind": "Service", "metadata": {
            "name": f"{meta['name']}-serve-svc", "labels": {"ray.io/serve": meta["name"]},
            "ownerReferences": [{"apiVersion": "ray.io/v1", "kind": "RayService",
                                 "name": meta["name"], "uid": meta["uid"]}]},
            "spec": {"clusterIP": "None", "ports": [{"name": "serve", "port": 8000}],
                     "selector": {"ray.io/cluster": cluster, "ray.io/node-type": "head"}}}
        try:
            current = self._core.read_namespaced_service(body["metadata"]["name"],
                                                         self.namespace)
        except client.ApiException:
            self._core.create_namespaced_service(self.namespace, body)
            return
        if current.spec.selector != body["spec"]["selector"]:
            self._core.patch_namespaced_service(body["metadata"]["name"], self.namespace,
                                                {"spec": {"selector": body["spec"]["selector"]}})

    # -- the garbage collector's share -----------------------------------------------------------
    def _collect(self, service: dict[str, Any]) -> None:
        name = service["metadata"]["name"]
        owned = self._list("rayclusters", f"ray.io/originated-from-cr-name={name}")
        for cluster in owned:
            if not cluster["metadata"].get("deletionTimestamp"):
                self._delete_cluster(cluster["metadata"]["name"])
        with contextlib.suppress(client.ApiException):
            self._core.delete_namespaced_service(f"{name}-serve-svc", self.namespace,
                                                 _preload_content=False)
        if owned:
            return  # their pods go first (the RayCluster collector and the kubelet double)
        lift_foreground_finalizer(self._custom, self.namespace, "rayservices", service)


def lift_foreground_finalizer(custom: client.CustomObjectsApi, namespace: str, plural: str,
                              obj: dict[str, Any]) -> None:
    """What the garbage collector does once an object's dependents are gone: drop the
    ``foregroundDeletion`` finalizer, so the API server removes the object."""
    finalizers = [f for f in obj["metadata"].get("finalizers") or []
                  if f != "foregroundDeletion"]
    with contextlib.suppress(client.ApiException):
        custom.patch_namespaced_custom_object(
            "ray.io", "v1", namespace, plural, obj["metadata"]["name"],
            {"metadata": {"finalizers": finalizers}})
