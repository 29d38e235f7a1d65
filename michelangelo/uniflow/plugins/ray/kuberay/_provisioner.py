"""A ``RayCluster`` custom resource per RayTask: created, watched until ready, deleted.

Lifecycle: the manifest is rendered, checked against the nodes (``_fit``) and by a
server-side dry run, then created. While KubeRay and the scheduler work, pod phases and the
reasons pods wait (scheduling failures, image pulls, crash loops, read by ``_pod_diagnosis``)
are reported as they change; a reason that cannot heal fails the task at once, and a
provisioning deadline, separate from the task's own timeout, ends the wait with the phase it
was stuck in; pods KubeRay could not create (``ReplicaFailure``) fail it at once. Ready means all ``1 + worker_instances`` pods
exist and are ready (with the ``HeadPodReady`` and ``RayClusterProvisioned`` conditions, or
``status.state`` where KubeRay writes no conditions), a dashboard that answers, and as many
Ray nodes alive. The cluster is deleted however the task ends.
"""

from __future__ import annotations

import json
import os
import re
import time
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from michelangelo.uniflow.core.errors import ClusterError, UserError
from michelangelo.uniflow.plugins.ray.kuberay._fit import check_fit
from michelangelo.uniflow.plugins.ray.kuberay._kube import KubeApi, KubeError, KubeTarget
from michelangelo.uniflow.plugins.ray.kuberay._manifest import (
    AUTH_MODES,
    AUTH_TOKEN_KEY,
    HEAD_PORTS,
    RUN_LABEL,
    TASK_LABEL,
    ray_cluster_manifest,
)
from michelangelo.uniflow.plugins.ray.kuberay._pod_diagnosis import (
    events_about,
    fatal_reason,
    last_words,
    pending_reasons,
)
from michelangelo.uniflow.plugins.ray.kuberay._portforward import PortForward
from michelangelo.uniflow.plugins.ray.kuberay._status import head_ready, pods_ready, refused_pods
from michelangelo.uniflow.plugins.ray.provisioning import ClusterState, RayCluster, RayTask

DEADLINE_ENV = "UF_KUBERAY_PROVISION_TIMEOUT_S"
_DEFAULT_DEADLINE_S = 600.0
_POLL_S = 0.5
_DELETE_WAIT_S = 120.0
HEAD_ACCESS = ("auto", "pod", "port-forward")


@dataclass(frozen=True)
class KubeRaySettings:
    """Where and how RayClusters are made (from ``remote-run --kuberay`` options)."""

    namespace: str = "default"
    image: str | None = None
    target: KubeTarget = field(default_factory=KubeTarget)
    deadline_s: float | None = None
    storage_secret: str | None = None
    # Off only where a node autoscaler adds nodes for pods that do not fit yet.
    fit_check: bool = True
    # Where a host port mapping reaches the head (the kind sandbox): its dashboard URL and the
    # node ports the head Service must use. None: the head pod's own address.
    head_address: str | None = None
    head_node_ports: dict[str, int] | None = None
    # How this client reaches the head otherwise: "pod" (its address), "port-forward" (through
    # the API server), or "auto": the pod's address when it answers from here, else forward.
    head_access: str = "auto"
    # Where RayServices expose Serve on the nodes (the sandbox maps it to 127.0.0.1:8000).
    serve_node_port: int | None = None
    # Ray's authentication on the RayClusters (AUTH_MODES): "token" has KubeRay make a token
    # per cluster; this client reads it from the cluster's Secret and sends it.
    auth: str = "disabled"
    # The share of each Ray node's CPUs its pod requests (ray_cluster_manifest); the sandbox
    # asks for less than 1, so that production-shaped RayTasks fit its one shared node.
    cpu_request_fraction: float = 1.0

    def __post_init__(self) -> None:
        if self.auth not in AUTH_MODES:
            raise UserError(
                f"--auth {self.auth!r} is not one of {', '.join(AUTH_MODES)}. Fix: --auth token "
                "(KubeRay gives each RayCluster a token of its own) or leave it out.")
        if self.head_access not in HEAD_ACCESS:
            raise UserError(
                f"head access {self.head_access!r} is not one of {', '.join(HEAD_ACCESS)}. Fix: "
                "--head-access port-forward (through the API server) or pod (its address).")

    def deadline(self) -> float:
        if self.deadline_s is not None:
            return float(self.deadline_s)
        raw = os.environ.get(DEADLINE_ENV)
        if raw is None:
            return _DEFAULT_DEADLINE_S
        try:
            value = float(raw)
        except ValueError:
            raise UserError(f"{DEADLINE_ENV}={raw!r} must be a number of seconds, e.g. 600.") \
                from None
        if value <= 0:
            raise UserError(f"{DEADLINE_ENV}={raw!r} must be more than 0 seconds.")
        return value


def cluster_name(run_id: str, task_name: str) -> str:
    """A DNS-safe, unique, readable RayCluster name for one task of a run."""
    slug = re.sub(r"[^a-z0-9-]+", "-", task_name.lower()).strip("-")[:16].strip("-") or "task"
    stamp = re.sub(r"[^a-z0-9]", "", run_id.lower())[-6:]
    return f"uf-{slug}-{stamp}-{uuid.uuid4().hex[:5]}"


def label_value(value: str) -> str:
    """``value`` as a valid label value (63 characters of [A-Za-z0-9-_.], alphanumeric ends)."""
    cleaned = re.sub(r"[^A-Za-z0-9_.-]+", "-", value)[:63]
    return cleaned.strip("-_.") or "none"


class KubeRayCluster(RayCluster):
    """One RayCluster on Kubernetes, shaped like a RayTask, owned by one task of a run."""

    def __init__(self, task: RayTask, *, run_id: str, task_name: str,
                 settings: KubeRaySettings | None = None, api: KubeApi | None = None,
                 on_progress: Callable[[str], None] | None = None) -> None:
        self.task = task
        self.settings = settings or KubeRaySettings()
        self.run_id = run_id
        self.task_name = task_name
        self.name = cluster_name(run_id, task_name)
        self.namespace = self.settings.namespace
        self._api = api
        self._on_progress = on_progress or (lambda message: None)
        self._created = False
        self.head_ip: str | None = None
        self.head_pod: str | None = None
        self._forward: PortForward | None = None
        self._access: str | None = None if self.settings.head_access == "auto" \
            else self.settings.head_access
        self.reasons_seen: list[str] = []
        self.transition(ClusterState.PENDING)
        self._token: str | None = None  # the cluster's Ray token (auth "token"); never shown

    @property
    def auth_headers(self) -> dict[str, str]:
        """The headers a request to this cluster's dashboard and Jobs API needs (its token
        when the cluster runs with token authentication); empty otherwise."""
        return {"Authorization": f"Bearer {self._token}"} if self._token else {}

    @property
    def api(self) -> KubeApi:
        if self._api is None:
            self._api = KubeApi(self.settings.target)
        return self._api

    def manifest(self) -> dict[str, Any]:
        return ray_cluster_manifest(
            self.task, name=self.name, namespace=self.namespace, image=self.settings.image,
            labels={RUN_LABEL: label_value(self.run_id), TASK_LABEL: label_value(self.task_name)},
            storage_secret=self.settings.storage_secret,
            head_node_ports=self.settings.head_node_ports,
            auth=self.settings.auth,
            cpu_request_fraction=self.settings.cpu_request_fraction,
        )

    @property
    def created(self) -> bool:
        """Whether the RayCluster object was created (and so needs deleting)."""
        return self._created

    # -- RayCluster interface ----------------------------------------------------------------
    def start(self, *, fit_checked: bool = False) -> None:
        """Create the RayCluster and wait until it is ready.

        Args:
            fit_checked: The caller has checked the fit already (with the run's other
                clusters in the count), so the nodes are not checked again here.
        """
        deadline_s = self.settings.deadline()
        manifest = self.manifest()
        self._check_permissions()
        if self.settings.fit_check and not fit_checked:
            check_fit(manifest, self.api.nodes(), self.api.all_pods())
        try:
            self.api.create(manifest, dry_run=True)
        except KubeError as exc:
            raise UserError(
                f"the Kubernetes API refused RayCluster {self.name!r} in a dry run: "
                f"{exc.reason or exc}. Check the RayTask and --image/--namespace options."
            ) from None
        self.api.create(manifest)
        self._created = True
        self.transition(ClusterState.CREATED)
        try:
            self._wait_ready(time.monotonic() + deadline_s, deadline_s)
        except BaseException:
            self.transition(ClusterState.FAILED)
            raise
        self.transition(ClusterState.READY)

    def wait_for_nodes(self, timeout_s: float,
                       enough: Callable[[], bool] | None = None) -> None:
        return None  # start() returns only once every node is alive

    def shutdown(self) -> None:
        forward, self._forward = self._forward, None
        if forward is not None:
            forward.close()
        if self.state == ClusterState.DELETED or not self._created:
            self.transition(ClusterState.DELETED)
            return
        self.api.delete("RayCluster", self.name, self.namespace)
        deadline = time.monotonic() + _DELETE_WAIT_S
        while time.monotonic() < deadline:
            if self.api.get("RayCluster", self.name, self.namespace) is None:
                break
            time.sleep(_POLL_S)
        self.transition(ClusterState.DELETED)

    # -- waiting -----------------------------------------------------------------------------
    def _wait_ready(self, deadline: float, deadline_s: float) -> None:
        last = ""
        phase = "waiting for KubeRay to create pods"
        while True:
            obj = self.api.get("RayCluster", self.name, self.namespace)
            if obj is None:
                raise ClusterError(f"RayCluster {self.name!r} was deleted while starting.")
            pods = self.api.pods(self.namespace, f"ray.io/cluster={self.name}")
            events = self._events(pods)
            reasons = pending_reasons(pods, events)
            for reason in reasons:
                if reason not in self.reasons_seen:
                    self.reasons_seen.append(reason)
            fatal = fatal_reason(pods)
            if fatal:
                raise ClusterError(
                    f"RayCluster {self.name!r} cannot start: {fatal}. Fix the image or the "
                    "RayTask's resources; the cluster is being deleted."
                    + last_words(self.api, self.namespace, pods, hide=(self._token,))
                )
            refused = refused_pods(obj, events)
            if refused:
                raise ClusterError(
                    f"RayCluster {self.name!r} cannot start: KubeRay could not create its pods: "
                    f"{refused}. Fix: lower the RayTask's resources or worker_instances, or "
                    f"have the quota or admission policy of namespace {self.namespace!r} "
                    "allow them; the cluster is being deleted."
                )
            expected = 1 + self.task.worker_instances
            phase = _phase(obj, pods, expected)
            if any(p.get("spec", {}).get("nodeName") for p in pods):
                self.advance(ClusterState.SCHEDULED)
            status = f"{self.name}: {phase}" + (f" ({'; '.join(reasons)})" if reasons else "")
            if status != last:
                self._on_progress(status)
                last = status
            if head_ready(obj, pods):
                self.advance(ClusterState.HEAD_READY)
            if pods_ready(obj, pods, expected):
                head = self._head_url(pods)
                phase = "waiting for the head's dashboard to answer"
                if self._forward is not None and self._forward.refused:
                    raise UserError(self._forward_refused(
                        f"was refused: {self._forward.refused}", made=True))
                if self._forward is not None and self._forward.last_error:
                    phase += f" ({self._forward.last_error})"
                if head and self.settings.auth == "token" and self._token is None:
                    self._token = self._read_token()
                    if self._token is None:
                        phase = "waiting for KubeRay to make the cluster's auth token Secret"
                if head and self._dashboard_ready(head) and \
                        (self.settings.auth != "token" or self._token is not None):
                    alive = self._alive_nodes(head)
                    if alive >= expected:
                        self._connect(head)
                        return
                    phase = f"{alive} of {expected} Ray nodes alive"
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"RayCluster {self.name!r} was not ready within {deadline_s:.0f}s "
                    f"({DEADLINE_ENV}); it was stuck at: {phase}. Reasons seen: "
                    f"{'; '.join(self.reasons_seen) or 'none'}."
                )
            time.sleep(_POLL_S)

    def _events(self, pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return events_about(self.api, self.namespace, pods, self.name)

    def _head_url(self, pods: list[dict[str, Any]]) -> str | None:
        """The dashboard URL: a configured host mapping, the head pod's address, or a forward."""
        if self.settings.head_address:
            return self.settings.head_address.rstrip("/")
        for pod in pods:
            labels = pod["metadata"].get("labels") or {}
            ip = (pod.get("status") or {}).get("podIP")
            if labels.get("ray.io/node-type") == "head" and ip:
                self.head_ip, self.head_pod = ip, pod["metadata"]["name"]
                break
        else:
            return None
        port = HEAD_PORTS["dashboard"]
        if self._access is None:  # auto: decided once, when the head first has an address
            self._access = "pod" if _answers(self.head_ip, port) else "port-forward"
            if self._access == "port-forward":
                self._on_progress(f"{self.name}: the head pod's address {self.head_ip} does not "
                                  "answer from here; reaching it through the API server's "
                                  "port-forward")
        if self._access == "pod":
            return f"http://{self.head_ip}:{port}"
        if self._forward is None:
            self._forward = self.api.port_forward(self.namespace, self._current_head, port)
        return self._forward.url

    def _read_token(self) -> str | None:
        """The token KubeRay keeps in the Secret named like the cluster (None: not yet)."""
        try:
            return self.api.secret_value(self.name, self.namespace, AUTH_TOKEN_KEY)
        except KubeError as exc:
            if exc.status != 403:
                raise
            raise UserError(self._token_refused(f"was refused: {exc.reason}",
                                                made=True)) from None

    def _check_permissions(self) -> None:
        """Refusals the API server can tell before the RayCluster exists (a review each).

        ``--auth token`` reads the cluster's token Secret, and ``--head-access port-forward``
        opens ``pods/portforward``: a user without those learns it here, not once the head is
        up. ``auto`` access decides on a forward only when the head's address is known, so
        that case is still learned then. A review the server will not answer checks nothing.
        """
        if self.settings.auth == "token" and \
                self.api.allowed("get", "secrets", self.namespace) is False:
            raise UserError(self._token_refused(
                "would be refused, Kubernetes says", made=False))
        if self._access == "port-forward" and not self.settings.head_address and \
                self.api.allowed("create", "pods", self.namespace,
                                 subresource="portforward") is False:
            raise UserError(self._forward_refused(
                "would be refused, Kubernetes says", made=False))

    def _forward_refused(self, what: str, *, made: bool) -> str:
        """Why the head cannot be reached through a port-forward for this user, and the fix."""
        cluster = "the cluster is being deleted" if made else "no RayCluster was made"
        why = ("--head-access port-forward" if self.settings.head_access == "port-forward"
               else "--head-access auto (the head pod's address did not answer from here)")
        return (f"{why}: a port-forward to RayCluster {self.name!r}'s head {what}; {cluster}. "
                f"Fix: have your user granted 'create' on pods/portforward in namespace "
                f"{self.namespace!r}, or pass --head-access pod where pod addresses are "
                "reachable.")

    def _token_refused(self, what: str, *, made: bool) -> str:
        """Why ``--auth token`` cannot work for this user, and the fix."""
        cluster = "the cluster is being deleted" if made else "no RayCluster was made"
        return (f"--auth token: reading Secret {self.namespace}/{self.name} (the RayCluster's "
                f"Ray token, which KubeRay makes) {what}; {cluster}. Fix: have your user granted "
                f"'get' on secrets in namespace {self.namespace!r}, or leave --auth out.")

    def _current_head(self) -> str | None:
        """The head pod's name now (KubeRay replaces a head pod that dies)."""
        for pod in self.api.pods(self.namespace,
                                 f"ray.io/cluster={self.name},ray.io/node-type=head"):
            if not pod["metadata"].get("deletionTimestamp"):
                return pod["metadata"]["name"]
        return None

    def _dashboard_ready(self, url: str) -> bool:
        return _http_json(f"{url}/api/version", self.auth_headers) is not None

    def _alive_nodes(self, url: str) -> int:
        data = _http_json(f"{url}/nodes?view=summary", self.auth_headers)
        try:
            summary = data["data"]["summary"]
        except (TypeError, KeyError):
            return 0
        return sum(1 for node in summary if (node.get("raylet") or {}).get("state") == "ALIVE")

    def _connect(self, url: str) -> None:
        self.address = url
        self.dashboard_url = url


def _phase(obj: dict[str, Any], pods: list[dict[str, Any]], expected: int) -> str:
    if not pods:
        return "waiting for KubeRay to create pods"
    phases: dict[str, int] = {}
    for pod in pods:
        phase = (pod.get("status") or {}).get("phase") or "Pending"
        phases[phase] = phases.get(phase, 0) + 1
    out = "pods " + ", ".join(f"{count} {phase}" for phase, count in sorted(phases.items()))
    if len(pods) < expected:
        out += f" ({len(pods)} of {expected} created)"
    return out


def _answers(host: str | None, port: int) -> bool:
    """Whether ``host`` is reachable from here: a connection, or a refusal, within a second."""
    import socket

    try:
        socket.create_connection((host, port), timeout=1.0).close()
    except ConnectionRefusedError:
        return True  # the host answered; the dashboard is not listening yet
    except OSError:
        return False
    return True


def _http_json(url: str, headers: dict[str, str] | None = None) -> Any:
    try:
        request = urllib.request.Request(url, headers=headers or {})
        with urllib.request.urlopen(request, timeout=2) as response:
            return json.loads(response.read().decode() or "null")
    except Exception:
        return None
