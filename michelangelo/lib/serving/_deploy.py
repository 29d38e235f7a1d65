"""``deploy``, ``get_deployment``, ``list_deployments``: endpoints as Serve applications."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from michelangelo.lib.serving._cluster import connect, ensure_serve, http_address, serve_client
from michelangelo.lib.serving._description import MIB, DeploymentDescription
from michelangelo.lib.serving._errors import (
    DeploymentError,
    DeploymentNotFoundError,
    HTTPError,
)


@dataclass(frozen=True)
class Deployment:
    """A live endpoint serving one registered revision.

    Attributes:
        name: Deployment name (the Serve application and the OIP model name).
        spec: The resolved ``ModelSpec`` (numbered revision, never an alias).
        description: The plain deployment description.
        base_url: The Serve HTTP proxy, e.g. ``http://127.0.0.1:8000``.
        url: This endpoint: ``POST`` rows to it; OIP paths live under ``{url}/v2``.
    """

    name: str
    spec: Any
    description: DeploymentDescription
    base_url: str
    url: str

    @property
    def infer_url(self) -> str:
        """The Open Inference Protocol ``infer`` path of this endpoint."""
        return f"{self.url}/v2/models/{self.name}/infer"

    @property
    def root_infer_url(self) -> str:
        """The same ``infer`` path at the server's root (for clients given only host:port)."""
        return f"{self.base_url}/v2/models/{self.name}/infer"

    def predict(self, inputs: Any, timeout_s: float = 60.0) -> Any:
        """POST ``{"inputs": inputs}`` to :attr:`url` over HTTP; return ``predictions``.

        Raises:
            HTTPError: The endpoint answered with an error (its status and reason).
        """
        return post_json(self.url, {"inputs": _plain(inputs)}, timeout_s)["predictions"]

    def curl(self, inputs: Any) -> str:
        """The shell command that POSTs ``{"inputs": inputs}`` to this endpoint."""
        body = json.dumps({"inputs": _plain(inputs)})
        return f"curl -s -X POST {self.url} -H 'Content-Type: application/json' -d '{body}'"

    def delete(self) -> None:
        """Remove the endpoint (its Serve application) from the cluster."""
        delete_deployment(self.name)


def _plain(inputs: Any) -> Any:
    """Arrays and tensors (or a dict of them) as nested lists."""
    if isinstance(inputs, dict):
        return {k: _plain(v) for k, v in inputs.items()}
    return inputs.tolist() if hasattr(inputs, "tolist") else inputs


def post_json(url: str, body: Any, timeout_s: float = 60.0) -> dict[str, Any]:
    """POST JSON and decode the answer; an error status raises :class:`HTTPError`."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        payload = exc.read()
        try:
            message = json.loads(payload)["error"]
        except (ValueError, KeyError, TypeError):
            message = payload.decode(errors="replace")
        raise HTTPError(message, exc.code) from None


def _registry(registry: Any) -> Any:
    from michelangelo.lib.model_registry import ModelRegistry

    return registry if isinstance(registry, ModelRegistry) else ModelRegistry(registry)


def _default_name(project: str, model: str) -> str:
    raw = f"{project}-{model}".lower()
    cleaned = "".join(c if c.isalnum() or c in "-_" else "-" for c in raw).strip("-_")
    return cleaned[:63].rstrip("-_") or "model"


def deploy(spec: Any, *, name: str | None = None, num_replicas: int = 1,
           host: str = "127.0.0.1", port: int = 8000, registry: Any = None,
           max_batch_size: int | None = 32, batch_wait_timeout_s: float = 0.005,
           max_request_bytes: int = 8 * MIB, replica_cpus: float = 0.5) -> Deployment:
    """Serve a registered revision over HTTP on the connected Ray cluster.

    Deploying a ``name`` that already exists swaps its model in place: Serve starts the new
    replicas, routes to them once they are ready, then drains the old ones, so requests keep
    being answered throughout.

    In a ``remote-run --kuberay`` run the endpoint is made here, on the task's cluster, and,
    once the task succeeds, the client makes it a KubeRay ``RayService`` of the same name that
    outlives the run.

    Args:
        spec: Any form the registry accepts: ``ModelSpec``, ``"project/model"``,
            ``"project/model:3"``, ``"project/model@champion"``. Aliases are resolved now.
        name: Deployment name (default ``"{project}-{model}"``).
        num_replicas: Replicas behind the endpoint.
        host: Address the HTTP proxy binds (loopback unless you say otherwise).
        port: Port of the HTTP proxy (one per cluster).
        registry: A ``ModelRegistry`` or its root URL (default: the registry's default).
        max_batch_size: Most rows per forward pass across concurrent requests; ``None``
            turns dynamic batching off.
        batch_wait_timeout_s: How long a batch waits for more rows.
        max_request_bytes: Larger bodies are refused with 413.
        replica_cpus: Logical CPUs reserved per replica.

    Returns:
        The live :class:`Deployment`.

    Raises:
        ValueError: An argument is invalid (raised before any cluster is touched).
        DeploymentError: No cluster, or the replicas failed to become ready (with why).
    """
    reg = _registry(registry)
    revision = reg.get(spec)
    root = str(reg.url)
    if root.startswith("memory://"):
        raise ValueError(
            f"registry root {root!r} is in this process's memory, which serving replicas (other "
            "processes) cannot read. Fix: use a registry on shared storage (a local folder, "
            "s3://, gs://).")
    if not revision.input_example:
        raise DeploymentError(
            f"{revision.name} has no input example, so replicas cannot prove they serve it "
            "correctly. Fix: register it again with input_example=<a small batch>.")
    description = DeploymentDescription(
        name=name if name is not None else _default_name(revision.project_name,
                                                         revision.model_name),
        project_name=revision.project_name, model_name=revision.model_name,
        revision_id=revision.revision_id, weights_sha256=revision.weights_sha256,
        registry_url=root or None, num_replicas=num_replicas, max_batch_size=max_batch_size,
        batch_wait_timeout_s=batch_wait_timeout_s, max_request_bytes=max_request_bytes,
        replica_cpus=replica_cpus, host=host, port=port)
    connect()
    ensure_serve(host, port)
    _run(description)
    deployment = _deployment(description, revision.spec)
    from michelangelo.uniflow.core import record_artifact

    # The description lets a KubeRay run make the same endpoint a RayService afterwards.
    record_artifact("deployment", name=description.name, spec=str(revision.spec),
                    url=deployment.url, replicas=num_replicas,
                    _description=description.to_dict())
    return deployment


def _run(description: DeploymentDescription) -> None:
    from ray import serve

    from michelangelo.lib.serving._app import build_app

    existed = description.name in _app_names()
    if existed:
        _prove(description)
    try:
        serve.run(build_app({"description": description.to_dict()}), name=description.name,
                  route_prefix=description.route_prefix)  # waits until RUNNING or failed
    except Exception as exc:
        reason = _replica_error(description.name) or _last_line(str(exc)) or type(exc).__name__
        if not existed:
            serve.delete(description.name)
        raise DeploymentError(
            f"deployment {description.name!r} of {description.project_name}/"
            f"{description.model_name}:{description.revision_id} failed: {reason}") from None
    _ensure_gateway()


def _prove(description: DeploymentDescription) -> None:
    """Start the new revision beside the live endpoint, with no route, and remove it again.

    Serve's own rolling update stops old replicas before new ones have proven anything, so
    a revision that fails readiness would leave the endpoint answering 503s. Here it fails
    while the live endpoint is untouched: it keeps serving, and ``deploy`` raises.
    """
    from ray import serve

    from michelangelo.lib.serving._app import build_app

    candidate = f"_candidate-{description.name}"
    try:
        serve.run(build_app({"description": description.to_dict()}), name=candidate,
                  route_prefix=None)  # no HTTP route: it takes no traffic
    except Exception as exc:
        reason = _replica_error(candidate) or _last_line(str(exc)) or type(exc).__name__
        raise DeploymentError(
            f"deployment {description.name!r}: the new revision {description.project_name}/"
            f"{description.model_name}:{description.revision_id} failed readiness, so it took "
            f"no traffic and the endpoint keeps serving its current revision: {reason}"
        ) from None
    finally:
        serve.delete(candidate)


def _ensure_gateway() -> None:
    """Start the ``/v2`` gateway (the protocol at the server's root) unless it runs."""
    from ray import serve

    from michelangelo.lib.serving._gateway import GATEWAY_APP, GATEWAY_PREFIX, build_gateway

    app = serve.status().applications.get(GATEWAY_APP)
    if app is not None and str(getattr(app.status, "value", app.status)) == "RUNNING":
        return
    serve.run(build_gateway(), name=GATEWAY_APP, route_prefix=GATEWAY_PREFIX)


def _replica_error(name: str) -> str | None:
    """The replica constructor's own error, which Serve keeps in the deployment status."""
    from ray import serve

    try:
        app = serve.status().applications.get(name)
    except Exception:
        return None
    messages = [d.message for d in getattr(app, "deployments", {}).values()] if app else []
    for message in messages:
        found = _last_line(message or "")
        if found:
            return found
    return None


def _last_line(text: str) -> str | None:
    """The last ``SomeError: message`` line of a traceback, without the module path."""
    found = re.findall(r"^\s*(?:[\w.]+\.)?(\w+(?:Error|Exception): .+)$", text, re.MULTILINE)
    return found[-1].strip() if found else None


def _app_names() -> list[str]:
    from ray import serve

    if serve_client() is None:
        return []
    return list(serve.status().applications)


def _deployment(description: DeploymentDescription, spec: Any) -> Deployment:
    address = http_address() or (description.host, description.port)
    host = "127.0.0.1" if address[0] in ("0.0.0.0", "::") else address[0]
    base = f"http://{host}:{address[1]}"
    return Deployment(name=description.name, spec=spec, description=description,
                      base_url=base, url=f"{base}{description.route_prefix}")


def _ours(name: str, app_status: Any) -> bool:
    from michelangelo.lib.serving._gateway import is_endpoint

    return is_endpoint(name, app_status)


def get_deployment(name: str) -> Deployment:
    """The endpoint called ``name`` on the connected cluster.

    Raises:
        DeploymentNotFoundError: No such endpoint.
    """
    from ray import serve

    connect()
    apps = serve.status().applications if serve_client() is not None else {}
    if name not in apps or not _ours(name, apps[name]):
        known = sorted(n for n, a in apps.items() if _ours(n, a))
        raise DeploymentNotFoundError(
            f"no deployment {name!r} on this cluster; deployments: {known or 'none'}.")
    info = serve.get_app_handle(name).describe.remote().result(timeout_s=60)
    description = DeploymentDescription.from_dict(info["description"])
    from michelangelo.lib.checkpoints import ModelSpec

    spec = ModelSpec(description.project_name, description.model_name, description.revision_id)
    return _deployment(description, spec)


def list_deployments() -> list[Deployment]:
    """Every endpoint on the connected cluster that ``deploy`` made, by name."""
    from ray import serve

    connect()
    if serve_client() is None:
        return []
    return [get_deployment(n) for n, a in sorted(serve.status().applications.items())
            if _ours(n, a) and str(getattr(a, "status", "")).endswith("RUNNING")]


def delete_deployment(name: str) -> None:
    """Remove the endpoint ``name``.

    Raises:
        DeploymentNotFoundError: No such endpoint.
    """
    from ray import serve

    get_deployment(name)  # raises with the list of known names
    serve.delete(name)
