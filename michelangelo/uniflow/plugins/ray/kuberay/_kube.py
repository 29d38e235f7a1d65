"""The one place that talks to the Kubernetes API.

Everything KubeRay-related (provisioning, garbage collection, RayService) goes through
:class:`KubeApi`, a handful of verbs over plain dicts. The same code therefore runs against a
kind sandbox, a production cluster or the control plane the tests start, and a different
transport only needs another implementation of these verbs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from michelangelo.errors import ServiceError
from michelangelo.uniflow.core.errors import UserError
from michelangelo.uniflow.plugins.ray.kuberay._portforward import PortForward

# kind -> (group, version, plural); core kinds have group "".
_KINDS = {
    "RayCluster": ("ray.io", "v1", "rayclusters"),
    "RayService": ("ray.io", "v1", "rayservices"),
    "RayJob": ("ray.io", "v1", "rayjobs"),
}


class KubeError(ServiceError, RuntimeError):
    """The API server refused a request; ``status`` is its HTTP code, ``reason`` its words."""

    def __init__(self, message: str, *, status: int | None = None, reason: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason

    def __reduce__(self):
        return (_rebuild_kube_error, (str(self), self.status, self.reason))


def _rebuild_kube_error(message: str, status: int | None, reason: str) -> KubeError:
    return KubeError(message, status=status, reason=reason)


@dataclass(frozen=True)
class KubeTarget:
    """Which cluster to talk to: a kubeconfig file and context (None: the defaults)."""

    kubeconfig: str | None = None
    context: str | None = None


class KubeApi:
    """A small set of verbs on the Kubernetes API, over dicts, through the official client."""

    def __init__(self, target: KubeTarget | None = None) -> None:
        self.target = target or KubeTarget()
        try:
            from kubernetes import client, config
        except ImportError as exc:  # pragma: no cover - the sandbox extra brings it
            raise UserError(
                "KubeRay runs need the Kubernetes client: pip install 'michelangelo[sandbox]'."
            ) from exc
        try:
            self._client = config.new_client_from_config(
                config_file=self.target.kubeconfig, context=self.target.context)
        except config.ConfigException as exc:
            try:
                config.load_incluster_config()
                self._client = client.ApiClient()
            except config.ConfigException:
                raise UserError(
                    f"cannot reach Kubernetes: {exc}. Pass --kube-context CTX (or set "
                    "KUBECONFIG) to name the cluster, e.g. the kind sandbox's "
                    "'kind-michelangelo'."
                ) from None
        self._core = client.CoreV1Api(self._client)
        self._custom = client.CustomObjectsApi(self._client)
        self._version = client.VersionApi(self._client)
        self._authorization = client.AuthorizationV1Api(self._client)

    # -- custom objects ----------------------------------------------------------------------
    def create(self, manifest: dict[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
        """Create a KubeRay object; ``dry_run`` asks the server to validate and not persist."""
        group, version, plural = _KINDS[manifest["kind"]]
        namespace = manifest["metadata"].get("namespace", "default")
        kwargs: dict[str, Any] = {"dry_run": "All"} if dry_run else {}
        if dry_run and self.server_minor() >= 25:
            kwargs["field_validation"] = "Strict"
        return self._call(self._custom.create_namespaced_custom_object, group, version,
                          namespace, plural, manifest, **kwargs)

    def get(self, kind: str, name: str, namespace: str) -> dict[str, Any] | None:
        group, version, plural = _KINDS[kind]
        try:
            return self._call(self._custom.get_namespaced_custom_object, group, version,
                              namespace, plural, name)
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    def replace(self, manifest: dict[str, Any]) -> dict[str, Any]:
        group, version, plural = _KINDS[manifest["kind"]]
        meta = manifest["metadata"]
        return self._call(self._custom.replace_namespaced_custom_object, group, version,
                          meta.get("namespace", "default"), plural, meta["name"], manifest)

    def delete(self, kind: str, name: str, namespace: str) -> bool:
        """Delete an object; False when it was already gone."""
        group, version, plural = _KINDS[kind]
        try:
            self._call(self._custom.delete_namespaced_custom_object, group, version, namespace,
                       plural, name, propagation_policy="Foreground")
        except KubeError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def list(self, kind: str, namespace: str | None, label_selector: str = "") -> list[dict]:
        group, version, plural = _KINDS[kind]
        if namespace is None:
            out = self._call(self._custom.list_cluster_custom_object, group, version, plural,
                             label_selector=label_selector)
        else:
            out = self._call(self._custom.list_namespaced_custom_object, group, version,
                             namespace, plural, label_selector=label_selector)
        return list(out.get("items", []))

    # -- core objects ------------------------------------------------------------------------
    def nodes(self) -> list[dict[str, Any]]:
        return self._dicts(self._call(self._core.list_node).items)

    def pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        return self._dicts(self._call(self._core.list_namespaced_pod, namespace,
                                      label_selector=label_selector).items)

    def all_pods(self) -> list[dict[str, Any]]:
        return self._dicts(self._call(self._core.list_pod_for_all_namespaces).items)

    def events(self, namespace: str) -> list[dict[str, Any]]:
        return self._dicts(self._call(self._core.list_namespaced_event, namespace).items)

    def container_log(self, namespace: str, pod: str, container: str, *,
                      previous: bool = False, tail_lines: int | None = None) -> str:
        """What a container printed (``kubectl logs``); ``previous``: its last ended run."""
        kwargs: dict[str, Any] = {"container": container, "previous": previous}
        if tail_lines is not None:
            kwargs["tail_lines"] = tail_lines
        return self._call(self._core.read_namespaced_pod_log, pod, namespace, **kwargs)

    def service(self, name: str, namespace: str) -> dict[str, Any] | None:
        try:
            return self._client.sanitize_for_serialization(
                self._call(self._core.read_namespaced_service, name, namespace))
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    def secret_value(self, name: str, namespace: str, key: str) -> str | None:
        """One decoded value of a Secret; None when the Secret or the key is not there.

        The value is a credential: callers keep it out of messages and logs.
        """
        import base64

        try:
            secret = self._call(self._core.read_namespaced_secret, name, namespace)
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise
        raw = (secret.data or {}).get(key)
        return None if raw is None else base64.b64decode(raw).decode()

    # -- access ------------------------------------------------------------------------------
    def allowed(self, verb: str, resource: str, namespace: str, *,
                group: str = "", subresource: str = "") -> bool | None:
        """Whether this client's user may ``verb`` the ``resource`` (or its ``subresource``,
        e.g. ``pods``' ``portforward``) in ``namespace``.

        Asked with a SelfSubjectAccessReview, which every signed-in user may make (Kubernetes'
        own ``system:basic-user`` role), so a refusal can be told before anything is created.
        None when the server would not answer the review: the caller then learns from the
        request itself.
        """
        from kubernetes import client

        review = client.V1SelfSubjectAccessReview(spec=client.V1SelfSubjectAccessReviewSpec(
            resource_attributes=client.V1ResourceAttributes(
                verb=verb, resource=resource, group=group, namespace=namespace,
                subresource=subresource or None)))
        try:
            answer = self._call(self._authorization.create_self_subject_access_review, review)
        except KubeError:
            return None
        return bool(answer.status and answer.status.allowed)

    def port_forward(self, namespace: str, pod: Callable[[], str | None],
                     port: int) -> PortForward:
        """A started :class:`PortForward` from 127.0.0.1 to ``port`` of the pod ``pod()`` names."""
        return PortForward(lambda name, p: self._open_port_forward(namespace, name, p),
                           pod, port).start()

    def _open_port_forward(self, namespace: str, pod: str, port: int) -> Any:
        """One WebSocket to ``pods/portforward`` (the same credentials as every other call)."""
        from kubernetes.stream import ws_client

        cfg = self._client.configuration
        url = ws_client.get_websocket_url(
            f"{cfg.host}/api/v1/namespaces/{namespace}/pods/{pod}/portforward?ports={port}")
        headers = {"sec-websocket-protocol": "v4.channel.k8s.io"}
        for setting in cfg.auth_settings().values():  # as the generated calls add them
            if setting.get("in") == "header" and setting.get("value"):
                headers[setting["key"].lower()] = setting["value"]
        return ws_client.create_websocket(cfg, url, headers)

    def server_minor(self) -> int:
        if not hasattr(self, "_minor"):
            info = self._call(self._version.get_code)
            self._minor = int("".join(ch for ch in info.minor if ch.isdigit()) or 0)
        return self._minor

    # -- plumbing ------------------------------------------------------------------------------
    def _dicts(self, items: list[Any]) -> list[dict[str, Any]]:
        return [self._client.sanitize_for_serialization(item) for item in items]

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        from kubernetes.client.exceptions import ApiException

        try:
            return fn(*args, **kwargs)
        except ApiException as exc:
            reason = exc.reason or ""
            with contextlib.suppress(Exception):
                import json

                reason = json.loads(exc.body).get("message", reason)
            raise KubeError(f"Kubernetes API {exc.status}: {reason}", status=exc.status,
                            reason=reason) from None
