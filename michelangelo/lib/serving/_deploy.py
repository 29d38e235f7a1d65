"""``deploy``: a registered revision behind an HTTP endpoint, or beside one as a canary."""

from __future__ import annotations

import inspect
import time
from typing import Any

from michelangelo.errors import InputError
from michelangelo.lib.serving._canary import canary_share, start_canary, traffic_share
from michelangelo.lib.serving._cluster import connect, ensure_serve
from michelangelo.lib.serving._description import DeploymentDescription, endpoint_options
from michelangelo.lib.serving._endpoints import Deployment, end_rollout, handle, run
from michelangelo.lib.serving._errors import DeploymentError
from michelangelo.lib.serving._rollout import AutoRollback


def _registry(registry: Any) -> Any:
    from michelangelo.lib.model_registry import ModelRegistry

    return registry if isinstance(registry, ModelRegistry) else ModelRegistry(registry)


def _default_name(project: str, model: str) -> str:
    raw = f"{project}-{model}".lower()
    cleaned = "".join(c if c.isalnum() or c in "-_" else "-" for c in raw).strip("-_")
    return cleaned[:63].rstrip("-_") or "model"


def deploy(spec: Any, *, name: str | None = None, registry: Any = None,
           canary: float | None = None, traffic: dict[int, float] | None = None,
           auto_rollback: AutoRollback | None = None, **options: Any) -> Deployment:
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
        registry: A ``ModelRegistry`` or its root URL (default: the registry's default).
        **options: The endpoint's settings, each a field of :class:`DeploymentDescription`
            with its default there: ``num_replicas`` (1), ``host`` (``"127.0.0.1"``: loopback
            unless you say otherwise), ``port`` (8000, one proxy per cluster),
            ``max_batch_size`` (32 rows per forward pass across concurrent requests; ``None``
            turns dynamic batching off), ``batch_wait_timeout_s`` (0.005), ``max_request_bytes``
            (8 MiB; larger bodies get 413) and ``replica_cpus`` (0.5 per replica).
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
    settings = _settings(options)
    share = canary_share(canary, traffic, auto_rollback)
    if isinstance(auto_rollback, dict):
        auto_rollback = AutoRollback(**auto_rollback)
    reg = _registry(registry)
    revision = reg.get(spec)
    if traffic is not None:
        share = traffic_share(traffic, revision.revision_id)
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
        registry_url=root or None, **settings)
    connect()
    if share is not None:
        return start_canary(description, share, auto_rollback,
                             traffic_revisions=set(traffic) if traffic is not None else None)
    from michelangelo.uniflow.core import record_artifact, record_phases

    began = time.time()
    ensure_serve(description.host, description.port)
    serve_up = time.time()
    run(description)
    end_rollout(description.name, f"replaced by a deploy of revision {revision.revision_id}")
    deployment = handle(description, revision.spec)
    record_phases("Ray Serve", [("Serve start", serve_up - began),
                                ("replicas ready", time.time() - serve_up)])

    # The description lets a KubeRay run make the same endpoint a RayService afterwards.
    record_artifact("deployment", name=description.name, spec=str(revision.spec),
                    url=deployment.url, replicas=description.num_replicas,
                    _description=description.to_dict())
    return deployment




def _settings(options: dict[str, Any]) -> dict[str, Any]:
    """``deploy``'s endpoint options, checked by name; the values are checked by the
    description they become."""
    known = endpoint_options()
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise InputError(
            f"deploy() got unknown option(s) {unknown}. Fix: use the endpoint settings "
            f"{sorted(known)} (DeploymentDescription's fields), or name=, registry=, canary=, "
            "traffic=, auto_rollback=.")
    return {**known, **options}


def _signature() -> inspect.Signature:
    """``deploy``'s signature with the endpoint options spelled out, for help() and editors."""
    signature = inspect.signature(deploy)
    params = [p for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD]
    params += [inspect.Parameter(field, inspect.Parameter.KEYWORD_ONLY, default=default)
               for field, default in endpoint_options().items()]
    return signature.replace(parameters=params)


deploy.__signature__ = _signature()  # type: ignore[attr-defined]
