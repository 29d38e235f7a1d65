"""``deploy``, ``promote``, ``rollback``, ``get_deployment``: endpoints as Serve applications."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import re
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from michelangelo.errors import InputError
from michelangelo.lib.serving._cluster import connect, ensure_serve, http_address, serve_client
from michelangelo.lib.serving._description import MIB, DeploymentDescription
from michelangelo.lib.serving._errors import (
    DeploymentError,
    DeploymentNotFoundError,
    HTTPError,
)
from michelangelo.lib.serving._rollout import (
    CANARY,
    AutoRollback,
    Rollout,
    canary_app,
    end_record,
    find_record,
    rollout_of,
    start_record,
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
        return post_json(self.url, {"inputs": _plain(inputs)}, timeout_s)["predictions"]

    def curl(self, inputs: Any) -> str:
        """The shell command that POSTs ``{"inputs": inputs}`` to this endpoint."""
        body = json.dumps({"inputs": _plain(inputs)})
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
        request = urllib.request.Request(
            self.generate_url + "_stream", method="POST",
            data=json.dumps({"text_input": text, "parameters": parameters}).encode(),
            headers={"Content-Type": "application/json", "Accept": "text/event-stream"})
        try:
            response = urllib.request.urlopen(request, timeout=timeout_s)
        except urllib.error.HTTPError as exc:
            raise HTTPError(_reason(exc.read()), exc.code) from None
        with response:
            for line in response:
                if line.startswith(b"data: "):
                    event = json.loads(line[len(b"data: "):])
                    if "error" in event:
                        raise HTTPError(event["error"], 500)
                    yield event["text_output"]

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
        raise HTTPError(_reason(exc.read()), exc.code) from None


def _reason(payload: bytes) -> str:
    try:
        return json.loads(payload)["error"]
    except (ValueError, KeyError, TypeError):
        return payload.decode(errors="replace")


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
           max_request_bytes: int = 8 * MIB, replica_cpus: float = 0.5,
           canary: float | None = None, traffic: dict[int, float] | None = None,
           auto_rollback: AutoRollback | None = None) -> Deployment:
    """Serve a registered revision over HTTP on the connected Ray cluster.

    Deploying a ``name`` that already exists swaps its model in place: the new revision is
    proven beside the live one first (a revision that fails readiness takes no traffic and
    ``deploy`` raises), then Serve starts its replicas, routes to them once they are ready and
    drains the old ones, so requests keep being answered throughout. A canary rollout of
    that endpoint ends with the swap.

    With ``canary=`` (or ``traffic=``) the endpoint keeps its revision and the new one runs
    beside it, with the endpoint's settings, taking that share of the requests on the
    endpoint's URL and at the server's root; answers name the revision that gave them
    (``model_version``). :func:`promote` makes it the endpoint's revision, :func:`rollback`
    removes it, and ``auto_rollback`` removes it when it fails too often or answers too slowly.
    Deploying the same canary revision again only changes its share.

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
        canary: Share of requests, strictly between 0 and 1, for this revision beside the
            one the endpoint ``name`` serves.
        traffic: The same as ``{stable_revision: 1 - share, new_revision: share}``: both
            revisions of the model with weights that sum to 1.
        auto_rollback: With a canary: when to roll it back without being asked.

    Returns:
        The live :class:`Deployment` (with its :attr:`Deployment.rollout` for a canary).

    Raises:
        ValueError: An argument is invalid (raised before any cluster is touched).
        DeploymentError: No cluster, the replicas failed to become ready (with why), or a
            canary is not another revision of the endpoint's model.
        DeploymentNotFoundError: ``canary=`` or ``traffic=`` names no live endpoint.
    """
    share = _canary_share(canary, traffic, auto_rollback)
    if isinstance(auto_rollback, dict):
        auto_rollback = AutoRollback(**auto_rollback)
    reg = _registry(registry)
    revision = reg.get(spec)
    if traffic is not None:
        share = _traffic_share(traffic, revision.revision_id)
    root = str(reg.url)
    if root.startswith("memory://"):
        raise InputError(
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
    if share is not None:
        return _start_canary(description, share, auto_rollback,
                             traffic_revisions=set(traffic) if traffic is not None else None)
    from michelangelo.uniflow.core import record_artifact, record_phases

    began = time.time()
    ensure_serve(host, port)
    serve_up = time.time()
    _run(description)
    _end_rollout(description.name, f"replaced by a deploy of revision {revision.revision_id}")
    deployment = _deployment(description, revision.spec)
    record_phases("Ray Serve", [("Serve start", serve_up - began),
                                ("replicas ready", time.time() - serve_up)])

    # The description lets a KubeRay run make the same endpoint a RayService afterwards.
    record_artifact("deployment", name=description.name, spec=str(revision.spec),
                    url=deployment.url, replicas=num_replicas,
                    _description=description.to_dict())
    return deployment


def _canary_share(canary: Any, traffic: Any, auto_rollback: Any) -> float | None:
    """The canary's share from ``canary=`` (``traffic=`` is checked once the revision is known)."""
    if canary is not None and traffic is not None:
        raise InputError("deploy() takes canary= or traffic=, not both. Fix: canary=0.2, or "
                         "traffic={stable_revision: 0.8, new_revision: 0.2}.")
    if auto_rollback is not None:
        if canary is None and traffic is None:
            raise InputError("auto_rollback= applies to a canary: pass canary= (or traffic=) "
                             "too. Fix: deploy(spec, name=..., canary=0.2, auto_rollback=...).")
        if isinstance(auto_rollback, dict):
            AutoRollback(**auto_rollback)
        elif not isinstance(auto_rollback, AutoRollback):
            raise InputError(f"auto_rollback={auto_rollback!r} must be an AutoRollback. Fix: "
                             "auto_rollback=AutoRollback(max_error_rate=0.05).")
    if canary is None:
        return None
    if isinstance(canary, bool) or not isinstance(canary, int | float) or not (
            0 < canary < 1) or math.isnan(canary):
        raise InputError(
            f"canary={canary!r} must be a share strictly between 0 and 1 (the part of the "
            "requests the new revision answers). Fix: e.g. canary=0.2; to move all traffic "
            "use promote(name), or deploy without canary=.")
    return float(canary)


def _traffic_share(traffic: Any, new_revision: int) -> float:
    """The new revision's weight in ``traffic={revision: weight}``, checked."""
    if not isinstance(traffic, dict) or len(traffic) != 2 or not all(
            isinstance(r, int) and not isinstance(r, bool) for r in traffic):
        raise InputError(
            f"traffic={traffic!r} must map two revision numbers (the endpoint's and the new "
            f"one) to weights. Fix: e.g. traffic={{1: 0.8, {new_revision}: 0.2}}.")
    for revision, weight in traffic.items():
        if isinstance(weight, bool) or not isinstance(weight, int | float) or not (
                0 <= weight <= 1):
            raise InputError(f"traffic={traffic!r}: the weight of revision {revision} is "
                             f"{weight!r}; weights are shares between 0 and 1.")
    total = sum(traffic.values())
    if abs(total - 1) > 1e-6:
        raise InputError(f"traffic={traffic!r}: the weights sum to {total:g}, not 1. Fix: "
                         f"e.g. traffic={{1: 0.8, {new_revision}: 0.2}}.")
    if new_revision not in traffic:
        raise InputError(f"traffic={traffic!r} gives no weight to the revision being deployed "
                         f"({new_revision}). Fix: name it, e.g. "
                         f"traffic={{1: 0.8, {new_revision}: 0.2}}.")
    share = float(traffic[new_revision])
    if not 0 < share < 1:
        raise InputError(f"traffic={traffic!r}: the new revision {new_revision}'s weight must be "
                         "strictly between 0 and 1. Fix: to move all traffic use promote(name),"
                         " or deploy without traffic=.")
    return share


def _start_canary(description: DeploymentDescription, share: float,
                  auto_rollback: AutoRollback | None,
                  traffic_revisions: set[int] | None = None) -> Deployment:
    """Run ``description``'s revision beside the live endpoint with ``share`` of its requests."""
    from ray import serve

    from michelangelo.lib.serving._app import build_app

    name = description.name
    if name not in _app_names():
        known = sorted(n for n, a in serve.status().applications.items() if _ours(n, a)) \
            if serve_client() is not None else []
        raise DeploymentNotFoundError(
            f"no deployment {name!r} to run a canary beside (name={name!r}); deployments: "
            f"{known or 'none'}. Fix: deploy(spec, name={name!r}) without canary= first, or "
            "pass the name of a live endpoint.")
    stable = get_deployment(name)
    old = stable.description
    new_name = f"{description.project_name}/{description.model_name}"
    if (old.project_name, old.model_name) != (description.project_name, description.model_name):
        raise DeploymentError(
            f"a canary is another revision of the endpoint's model: {name!r} serves "
            f"{old.project_name}/{old.model_name}, not {new_name}. Fix: deploy {new_name} under "
            "its own name=.")
    if old.revision_id == description.revision_id:
        raise DeploymentError(
            f"endpoint {name!r} already serves {new_name}:{old.revision_id}; a canary is another "
            "revision. Fix: register the new revision and deploy that one with canary=.")
    if traffic_revisions is not None and old.revision_id not in traffic_revisions:
        other = sorted(traffic_revisions - {description.revision_id})
        raise InputError(f"traffic= weighs revisions {sorted(traffic_revisions)}, but endpoint "
                         f"{name!r} serves revision {old.revision_id}, not {other[0]}. Fix: "
                         f"traffic={{{old.revision_id}: ..., {description.revision_id}: ...}}.")
    canary = dataclasses.replace(old, revision_id=description.revision_id,
                                 weights_sha256=description.weights_sha256,
                                 registry_url=description.registry_url)
    app = canary_app(name)
    record = find_record(name)
    if record is not None:
        import ray

        current = rollout_of(ray.get(record.status.remote()))
        if (current.state == CANARY and current.canary_revision == canary.revision_id
                and app in _app_names()):
            refused = ray.get(record.set_share.remote(
                share, dataclasses.asdict(auto_rollback) if auto_rollback else None))
            if refused is None:
                return get_deployment(name)
        _end_rollout(name, f"replaced by a canary of revision {canary.revision_id}")
    try:
        # No route: it answers only what stable replicas send it.
        _run_apps([serve.RunTarget(build_app({"description": canary.to_dict()}), name=app,
                                   route_prefix=None)])
    except Exception as exc:
        reason = _replica_error(app) or _last_line(str(exc)) or type(exc).__name__
        serve.delete(app)
        raise DeploymentError(
            f"the canary {new_name}:{canary.revision_id} of endpoint {name!r} failed readiness, "
            f"so it took no traffic and the endpoint keeps serving revision "
            f"{old.revision_id}: {reason}") from None
    import ray

    record = start_record(name, old.revision_id, canary.revision_id, share, auto_rollback)
    ray.get(record.status.remote())  # replicas find it from now on
    return get_deployment(name)


def _end_rollout(name: str, reason: str) -> None:
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
    if canary_app(name) in _app_names():
        serve.delete(canary_app(name))


def _rollout_or_raise(name: str, verb: str) -> tuple[Deployment, Any, Rollout]:
    connect()
    deployment = get_deployment(name)  # raises with the list of known names
    record = find_record(name)
    if deployment.rollout is None or record is None:
        raise DeploymentError(
            f"endpoint {name!r} has no canary to {verb}; it serves revision "
            f"{deployment.spec.revision_id} alone. Fix: deploy(spec, name={name!r}, canary=0.2) "
            "first.")
    if deployment.rollout.state != CANARY:
        raise DeploymentError(
            f"endpoint {name!r} has no canary to {verb}: revision "
            f"{deployment.rollout.canary_revision} was rolled back ({deployment.rollout.reason})"
            f". Fix: deploy(spec, name={name!r}, canary=0.2) to start another.")
    return deployment, record, deployment.rollout


def promote(name: str) -> Deployment:
    """Make the canary of endpoint ``name`` its revision, with no request failed.

    All new requests go to the canary at once (it is proven and live); then the endpoint's
    replicas are swapped to its revision and the canary's own replicas are removed.

    Raises:
        DeploymentNotFoundError: No endpoint ``name``.
        DeploymentError: It has no canary (never had, or it was rolled back: with why).
    """
    import ray
    from ray import serve

    _, record, rollout = _rollout_or_raise(name, "promote")
    app = canary_app(name)
    info = serve.get_app_handle(app).describe.remote().result(timeout_s=60)
    promoted = DeploymentDescription.from_dict(info["description"])
    refused = ray.get(record.set_share.remote(1.0, None))
    if refused is not None:
        raise DeploymentError(f"endpoint {name!r} has no canary to promote: revision "
                              f"{rollout.canary_revision} was rolled back meanwhile ({refused}).")
    try:
        _run(promoted, prove=False)  # it has answered requests already
    except Exception:
        ray.get(record.set_share.remote(rollout.canary_share, None))
        raise
    _end_rollout(name, f"promoted to the endpoint's revision {promoted.revision_id}")
    return get_deployment(name)


def rollback(name: str, reason: str = "rolled back by hand (rollback())") -> Rollout:
    """Send all of endpoint ``name``'s traffic back to its revision and remove the canary.

    Returns once no request goes to the canary and its replicas are gone; the endpoint
    remembers the rollback and ``reason`` (``Deployment.rollout``) until the next canary.

    Raises:
        DeploymentNotFoundError: No endpoint ``name``.
        DeploymentError: It has no canary to roll back.
    """
    import ray

    _, record, _ = _rollout_or_raise(name, "roll back")
    ray.get(record.roll_back.remote(reason))
    return rollout_of(ray.get(record.status.remote()))


def _run(description: DeploymentDescription, prove: bool = True) -> None:
    from ray import serve

    from michelangelo.lib.serving._app import build_app

    applications = _applications()  # one controller round trip for both questions
    existed = description.name in applications
    if existed and prove:
        _prove(description)
    targets = [serve.RunTarget(build_app({"description": description.to_dict()}),
                               name=description.name, route_prefix=description.route_prefix)]
    gateway = _gateway_target(applications)
    if gateway is not None:  # the first endpoint: the /v2 gateway starts beside it, not after
        targets.append(gateway)
    try:
        _run_apps(targets)
    except Exception as exc:
        reason = _replica_error(description.name) or _last_line(str(exc)) or type(exc).__name__
        if not existed:
            serve.delete(description.name)
        if gateway is not None:  # started for this endpoint only: leave Serve as it was
            serve.delete(gateway.name)
        raise DeploymentError(
            f"deployment {description.name!r} of {description.project_name}/"
            f"{description.model_name}:{description.revision_id} failed: {reason}") from None


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
        _run_apps([serve.RunTarget(build_app({"description": description.to_dict()}),
                                   name=candidate, route_prefix=None)])  # takes no traffic
    except Exception as exc:
        reason = _replica_error(candidate) or _last_line(str(exc)) or type(exc).__name__
        raise DeploymentError(
            f"deployment {description.name!r}: the new revision {description.project_name}/"
            f"{description.model_name}:{description.revision_id} failed readiness, so it took "
            f"no traffic and the endpoint keeps serving its current revision: {reason}"
        ) from None
    finally:
        serve.delete(candidate)


def _gateway_target(applications: dict[str, Any]) -> Any:
    """The ``/v2`` gateway (the protocol at the server's root) to run, or None when it runs.

    Args:
        applications: Serve's applications by name, as ``_applications()`` returns them.
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


def _run_apps(targets: list[Any]) -> None:
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
    return list(_applications())


def _applications() -> dict[str, Any]:
    """Serve's applications by name (their status objects); empty when Serve is not running."""
    from ray import serve

    if serve_client() is None:
        return {}
    return dict(serve.status().applications)


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
    return dataclasses.replace(_deployment(description, spec), rollout=_rollout(name))


def _rollout(name: str) -> Rollout | None:
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
            if _ours(n, a) and str(getattr(a, "status", "")).endswith("RUNNING")]


def delete_deployment(name: str) -> None:
    """Remove the endpoint ``name``.

    Raises:
        DeploymentNotFoundError: No such endpoint.
    """
    from ray import serve

    get_deployment(name)  # raises with the list of known names
    _end_rollout(name, "the endpoint was deleted")
    serve.delete(name)
