"""TEST DOUBLE of the KubeRay operator (1.7), at its boundary: RayCluster objects in, pods,
a head Service and status conditions out, through the real API server.

The real operator cannot be built here (it needs the Go module proxy). This double does the
part our provisioner relies on, the way KubeRay 1.7 documents it: one head pod and
``replicas`` worker pods per RayCluster, labelled ``ray.io/cluster``, ``ray.io/node-type`` and
``ray.io/group``, whose container runs ``ray start`` with the ``rayStartParams``; a
``<name>-head-svc`` Service; the ``HeadPodReady`` and ``RayClusterProvisioned`` conditions
(the latter, as KubeRay's, True once the pods that exist are ready, however many exist).
No kube-controller-manager runs on the test plane either, so the double also does the garbage
collector's share for its own objects: when a RayCluster is being deleted in the foreground it
deletes the pods and Service it made, then lifts the ``foregroundDeletion`` finalizer.
RayServices are handled by ``_rayservice_operator_double``.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from typing import Any

from kubernetes import client

from tests.uniflow.plugins.ray.kuberay.bed._rayservice_operator_double import (
    RayServiceControllerDouble,
    lift_foreground_finalizer,
)


class OperatorDouble:
    def __init__(self, api_client: Any, namespace: str = "default") -> None:
        self.namespace = namespace
        self._core = client.CoreV1Api(api_client)
        self._custom = client.CustomObjectsApi(api_client)
        self._api_client = api_client
        self.services = RayServiceControllerDouble(self._core, self._custom, namespace)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="operator-double")
        self.errors: list[str] = []

    def start(self) -> OperatorDouble:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.reconcile_all()
            except Exception as exc:  # keep reconciling; tests read .errors
                self.errors.append(f"{type(exc).__name__}: {exc}"[:2000])
            self._stop.wait(0.3)

    # -- reconcile ---------------------------------------------------------------------------
    def reconcile_all(self) -> None:
        clusters = self._custom.list_namespaced_custom_object(
            "ray.io", "v1", self.namespace, "rayclusters")["items"]
        for cluster in clusters:
            if cluster["metadata"].get("deletionTimestamp"):
                self._collect(cluster)
            else:
                self._reconcile(cluster)
        self.services.reconcile_all()

    def _pods(self, name: str) -> list[Any]:
        return self._core.list_namespaced_pod(
            self.namespace, label_selector=f"ray.io/cluster={name}").items

    def _reconcile(self, cluster: dict[str, Any]) -> None:
        name = cluster["metadata"]["name"]
        spec = cluster["spec"]
        pods = self._pods(name)
        groups = {(p.metadata.labels or {}).get("ray.io/group") for p in pods}
        if "headgroup" not in groups:
            self._create_service(cluster)
            self._create_pod(cluster, spec["headGroupSpec"], "headgroup", head=True)
        for group in spec.get("workerGroupSpecs", []):
            have = sum(1 for p in pods if (p.metadata.labels or {}).get("ray.io/group")
                       == group["groupName"] and not p.metadata.deletion_timestamp)
            for _ in range(int(group.get("replicas", 0)) - have):
                self._create_pod(cluster, group, group["groupName"], head=False)
        self._update_status(cluster, self._pods(name))

    def _owner(self, cluster: dict[str, Any]) -> dict[str, Any]:
        meta = cluster["metadata"]
        return {"apiVersion": "ray.io/v1", "kind": "RayCluster", "name": meta["name"],
                "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}

    def _create_service(self, cluster: dict[str, Any]) -> None:
        name = cluster["metadata"]["name"]
        ports = cluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0].get(
            "ports", [])
        body = {"apiVersion": "v1", "kind": "Service", "metadata": {
            "name": f"{name}-head-svc", "labels": {"ray.io/cluster": name},
            "ownerReferences": [self._owner(cluster)]},
            "spec": {"clusterIP": "None", "selector": {
                "ray.io/cluster": name, "ray.io/node-type": "head"},
                "ports": [{"name": p["name"], "port": p["containerPort"]} for p in ports]}}
        with contextlib.suppress(client.ApiException):
            self._core.create_namespaced_service(self.namespace, body)

    def _create_pod(self, cluster: dict[str, Any], group: dict[str, Any], group_name: str,
                    *, head: bool) -> None:
        name = cluster["metadata"]["name"]
        template = group["template"]
        params = dict(group.get("rayStartParams") or {})
        if head:
            words = ["ray", "start", "--head", "--block"]
            pod_name = f"{name}-head-{uuid.uuid4().hex[:5]}"
        else:
            words = ["ray", "start", "--block",
                     f"--address={name}-head-svc.{self.namespace}.svc.cluster.local:6379"]
            pod_name = f"{name}-{group_name}-worker-{uuid.uuid4().hex[:5]}"
        words += [f"--{key}={value}" for key, value in params.items()]
        containers = []
        for index, container in enumerate(template["spec"]["containers"]):
            container = dict(container)
            if index == 0:
                container["command"] = ["/bin/bash", "-lc", "--"]
                container["args"] = ["ulimit -n 65536; " + " ".join(words)]
            containers.append(container)
        labels = {**(template.get("metadata") or {}).get("labels", {}),
                  "ray.io/cluster": name, "ray.io/group": group_name,
                  "ray.io/node-type": "head" if head else "worker", "ray.io/is-ray-node": "yes"}
        body = {"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": pod_name, "labels": labels, "ownerReferences": [self._owner(cluster)]},
            "spec": {**template["spec"], "containers": containers, "restartPolicy": "Always"}}
        self._core.create_namespaced_pod(self.namespace, body)

    def _update_status(self, cluster: dict[str, Any], pods: list[Any]) -> None:
        def ready(pod: Any) -> bool:
            return any(c.type == "Ready" and c.status == "True"
                       for c in (pod.status.conditions or []))

        head = [p for p in pods if p.metadata.labels.get("ray.io/node-type") == "head"]
        workers = [p for p in pods if p.metadata.labels.get("ray.io/node-type") == "worker"]
        desired = sum(int(g.get("replicas", 0)) for g in cluster["spec"].get(
            "workerGroupSpecs", []))
        head_ready = bool(head) and ready(head[0])
        ready_workers = sum(1 for p in workers if ready(p))
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        old = {c["type"]: c for c in (cluster.get("status") or {}).get("conditions", [])}
        # As KubeRay 1.7's calculateStatus: Provisioned once every pod that exists runs and is
        # ready, without counting them, and it stays so; state "ready" does count them.
        all_running = bool(pods) and all(p.status.phase == "Running" and ready(p) for p in pods)
        provisioned = all_running or (old.get("RayClusterProvisioned") or {}).get(
            "status") == "True"
        counted = all_running and len(pods) == desired + 1

        def condition(kind: str, ok: bool, reason: str) -> dict[str, Any]:
            status = "True" if ok else "False"
            previous = old.get(kind)
            since = previous["lastTransitionTime"] if previous and previous["status"] == status \
                else now
            # A non-empty message: the client drops empty strings, which 1.20 then reads as null.
            return {"type": kind, "status": status, "reason": reason,
                    "message": f"{kind} is {status}", "lastTransitionTime": since}

        status: dict[str, Any] = {
            "conditions": [
                condition("HeadPodReady", head_ready, "HeadPodRunningAndReady" if head_ready
                          else "HeadPodNotFound" if not head else "HeadPodNotReady"),
                condition("RayClusterProvisioned", provisioned, "AllPodRunningAndReadyFirstTime"
                          if provisioned else "RayClusterPodsProvisioning"),
            ],
            "desiredWorkerReplicas": desired,
            "readyWorkerReplicas": ready_workers,
            "availableWorkerReplicas": ready_workers,
            "state": "ready" if counted or (cluster.get("status") or {}).get("state") == "ready"
            else "",
        }
        if head and head[0].status.pod_ip:
            status["head"] = {"podIP": head[0].status.pod_ip, "podName": head[0].metadata.name}
        if not status["state"]:
            del status["state"]
        if (cluster.get("status") or {}) != status:
            self._custom.patch_namespaced_custom_object_status(
                "ray.io", "v1", self.namespace, "rayclusters", cluster["metadata"]["name"],
                {"status": status})

    # -- the garbage collector's share ---------------------------------------------------------
    def _collect(self, cluster: dict[str, Any]) -> None:
        name = cluster["metadata"]["name"]
        pods = self._pods(name)
        for pod in pods:
            if not pod.metadata.deletion_timestamp:
                with contextlib.suppress(client.ApiException):
                    self._core.delete_namespaced_pod(pod.metadata.name, self.namespace)
        with contextlib.suppress(client.ApiException):
            # Unparsed: this client version fails to read the Status a Service delete returns.
            self._core.delete_namespaced_service(f"{name}-head-svc", self.namespace,
                                                 _preload_content=False)
        if pods:
            return  # the kubelet double removes them once their processes are gone
        lift_foreground_finalizer(self._custom, self.namespace, "rayclusters", cluster)
