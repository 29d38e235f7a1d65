"""Endpoints as Ray Serve applications: run one (proven beside the live one first), look one
up, list and delete them; :class:`Deployment` is the handle users get back.

``_deploy`` resolves a registered revision into a description and runs it here; ``_canary``
runs a second revision beside an endpoint.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from michelangelo.lib.serving._client import plain, post_json, stream_events
from michelangelo.lib.serving._cluster import connect, http_address, serve_client
from michelangelo.lib.serving._description import DeploymentDescription
from michelangelo.lib.serving._errors import DeploymentError, DeploymentNotFoundError
from michelangelo.lib.serving._rollout import (
    Rollout,
    canary_app,
    end_record,
    find_record,
    rollout_of,
)

_READY_POLL_S = 0.25  # how often a deploy asks Serve whether its applications are RUNNING


@dataclass(frozen=True)
class Deployment:
    """A live endpoint serving one registered revision.

    Attributes:
        name: Deployment name (the Serve application and the OIP model name).
        spec: The resolved ``ModelSpec`` (numbered revision, never an alias).
        description: The plain deployment description.
        base_url: The Serve HTTP proxy, e.g. ``http://127.0.0.1:8000``.
        url: This endpoint: ``POST`` rows to it; OIP paths live under ``{url}/v2``.
        rollout: The canary rollout beside the served revision, or the last one rolled
            back (with its reason); None when there is none.
    """

    name: str
    spec: Any
    description: DeploymentDescription
    base_url: str
    url: str
    rollout: Rollout | None = None

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
        return post_json(self.url, {"inputs": plain(inputs)}, timeout_s)["predictions"]

    def curl(self, inputs: Any) -> str:
        """The shell command that POSTs ``{"inputs": inputs}`` to this endpoint."""
        body = json.dumps({"inputs": plain(inputs)})
        return f"curl -s -X POST {self.url} -H 'Content-Type: application/json' -d '{body}'"

    @property
    def generate_url(self) -> str:
        """The generate extension's path at the server's root (text models); ``_stream``
        appended is ``generate_stream``."""
        return f"{self.base_url}/v2/models/{self.name}/generate"

    def generate(self, text: str, timeout_s: float = 60.0, **parameters: Any) -> str:
        """The continuation of ``text`` from a text model (``max_tokens``, ``temperature``).

        Raises:
            HTTPError: The endpoint answered with an error (its status and reason).
        """
        body = {"text_input": text, "parameters": parameters}
        return post_json(self.generate_url, body, timeout_s)["text_output"]

    def generate_stream(self, text: str, timeout_s: float = 60.0,
                        **parameters: Any) -> Iterator[str]:
        """The continuation of ``text`` chunk by chunk as the server streams it.

        Closing the iterator early closes the connection, which stops the generation.

        Raises:
            HTTPError: The endpoint refused the request, or reported an error mid-stream.
        """
        body = {"text_input": text, "parameters": parameters}
        for event in stream_events(self.generate_url + "_stream", body, timeout_s):
            yield event["text_output"]

    def delete(self) -> None:
        """Remove the endpoint (its Serve application) from the cluster."""
        delete_deployment(self.name)


def end_rollout(name: str, reason: str) -> None:
    """Take traffic off ``name``'s canary (if any), remove it and forget its record."""
    import ray
    from ray import serve

    record = find_record(name)
    if record is not None:
        # A record that died meanwhile: still remove what it pointed at.
        with contextlib.suppress(Exception):
            ray.get(record.roll_back.remote(reason))
        end_record(name)
        deadline = time.monotonic() + 60
        while find_record(name) is not None and time.monotonic() < deadline:
            time.sleep(0.1)  # the name is free again only once the actor is gone
    if canary_app(name) in app_names():
        serve.delete(canary_app(name))


def run(description: DeploymentDescription, prove: bool = True) -> None:
    from ray import serve

    from michelangelo.lib.serving._app import build_app

    applications = serve_applications()  # one controller round trip for both questions
    existed = description.name in applications
    if existed and prove:
        prove_beside(description)
    targets = [serve.RunTarget(build_app({"description": description.to_dict()}),
                               name=description.name, route_prefix=description.route_prefix)]
    gateway = gateway_target(applications)
    if gateway is not None:  # the first endpoint: the /v2 gateway starts beside it, not after
        targets.append(gateway)
    try:
        run_apps(targets)
    except Exception as exc:
        reason = replica_error(description.name) or last_line(str(exc)) or type(exc).__name__
        if not existed:
            serve.delete(description.name)
        if gateway is not None:  # started for this endpoint only: leave Serve as it was
            serve.delete(gateway.name)
        raise DeploymentError(
            f"deployment {description.name!r} of {description.project_name}/"
            f"{description.model_name}:{description.revision_id} failed: {reason}") from None


def prove_beside(description: DeploymentDescription) -> None:
    """Start the new revision beside the live endpoint, with no route, and remove it again.

    Serve's own rolling update stops old replicas before new ones have proven anything, so
    a revision that fails readiness would leave the endpoint answering 503s. Here it fails
    while the live endpoint is untouched: it keeps serving, and ``deploy`` raises.
    """
    from ray import serve

    from michelangelo.lib.serving._app import build_app

    candidate = f"_candidate-{description.name}"
    try:
        run_apps([serve.RunTarget(build_app({"description": description.to_dict()}),
                                   name=candidate, route_prefix=None)])  # takes no traffic
    except Exception as exc:
        reason = replica_error(candidate) or last_line(str(exc)) or type(exc).__name__
        raise DeploymentError(
            f"deployment {description.name!r}: the new revision {description.project_name}/"
            f"{description.model_name}:{description.revision_id} failed readiness, so it took "
            f"no traffic and the endpoint keeps serving its current revision: {reason}"
        ) from None
    finally:
        serve.delete(candidate)


def gateway_target(applications: dict[str, Any]) -> Any:
    """The ``/v2`` gateway (the protocol at the server's root) to run, or None when it runs.

    Args:
        applications: Serve's applications by name, as ``serve_applications()`` returns them.
    """
    from ray import serve

    from michelangelo.lib.serving._gateway import (
        GATEWAY_APP,
        GATEWAY_PREFIX,
        app_state,
        build_gateway,
    )

    app = applications.get(GATEWAY_APP)
    if app is not None and app_state(app) == "RUNNING":
        return None
    return serve.RunTarget(build_gateway(), name=GATEWAY_APP, route_prefix=GATEWAY_PREFIX)


def run_apps(targets: list[Any]) -> None:
    """Deploy ``targets`` and return once every one of them is RUNNING.

    Serve's own wait asks for an application's status once a second, so a deploy returned
    up to a second after its replicas were ready; this asks every ``_READY_POLL_S``.

    Raises:
        RuntimeError: An application failed to deploy (Serve's message), or went away.
    """
    from ray import serve

    from michelangelo.lib.serving._gateway import app_state

    serve.run_many(targets, wait_for_applications_running=False)
    client = serve_client()
    pending = [target.name for target in targets]
    while pending:
        for name in list(pending):
            # One application's status from the controller: serve.status() would build the
            # whole instance's details (each router class pickled) four times a second.
            app = client.get_serve_status(name).app_status
            status = app_state(app)
            if status == "NOT_STARTED":  # what the controller says of an unknown name
                raise DeploymentError(f"application {name!r} went away while it was deploying")
            if status == "DEPLOY_FAILED":
                raise DeploymentError(f"Deploying application {name} failed: {app.message}")
            if status == "RUNNING":
                pending.remove(name)
        if pending:
            time.sleep(_READY_POLL_S)


def replica_error(name: str) -> str | None:
    """The replica constructor's own error, which Serve keeps in the deployment status."""
    from ray import serve

    try:
        app = serve.status().applications.get(name)
    except Exception:
        return None
    messages = [d.message for d in getattr(app, "deployments", {}).values()] if app else []
    for message in messages:
        found = last_line(message or "")
        if found:
            return found
    return None


def last_line(text: str) -> str | None:
    """The last ``SomeError: message`` line of a traceback, without the module path."""
    found = re.findall(r"^\s*(?:[\w.]+\.)?(\w+(?:Error|Exception): .+)$", text, re.MULTILINE)
    return found[-1].strip() if found else None


def app_names() -> list[str]:
    return list(serve_applications())


def serve_applications() -> dict[str, Any]:
    """Serve's applications by name (their status objects); empty when Serve is not running."""
    from ray import serve

    if serve_client() is None:
        return {}
    return dict(serve.status().applications)


def handle(description: DeploymentDescription, spec: Any) -> Deployment:
    address = http_address() or (description.host, description.port)
    host = "127.0.0.1" if address[0] in ("0.0.0.0", "::") else address[0]
    base = f"http://{host}:{address[1]}"
    return Deployment(name=description.name, spec=spec, description=description,
                      base_url=base, url=f"{base}{description.route_prefix}")


def is_ours(name: str, app_status: Any) -> bool:
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
    if name not in apps or not is_ours(name, apps[name]):
        known = sorted(n for n, a in apps.items() if is_ours(n, a))
        raise DeploymentNotFoundError(
            f"no deployment {name!r} on this cluster; deployments: {known or 'none'}.")
    info = serve.get_app_handle(name).describe.remote().result(timeout_s=60)
    description = DeploymentDescription.from_dict(info["description"])
    from michelangelo.lib.checkpoints import ModelSpec

    spec = ModelSpec(description.project_name, description.model_name, description.revision_id)
    return dataclasses.replace(handle(description, spec), rollout=rollout_now(name))


def rollout_now(name: str) -> Rollout | None:
    import ray

    record = find_record(name)
    if record is None:
        return None
    try:
        return rollout_of(ray.get(record.status.remote(), timeout=60))
    except Exception:  # removed meanwhile
        return None


def list_deployments() -> list[Deployment]:
    """Every endpoint on the connected cluster that ``deploy`` made, by name."""
    from ray import serve

    connect()
    if serve_client() is None:
        return []
    return [get_deployment(n) for n, a in sorted(serve.status().applications.items())
            if is_ours(n, a) and str(getattr(a, "status", "")).endswith("RUNNING")]


def delete_deployment(name: str) -> None:
    """Remove the endpoint ``name``.

    Raises:
        DeploymentNotFoundError: No such endpoint.
    """
    from ray import serve

    get_deployment(name)  # raises with the list of known names
    end_rollout(name, "the endpoint was deleted")
    serve.delete(name)
