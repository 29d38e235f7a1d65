"""Canary rollouts: a second revision beside an endpoint with a share of its requests, then
promoted (made the endpoint's revision) or rolled back, with no request failed.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from michelangelo.errors import InputError
from michelangelo.lib.serving._cluster import connect, serve_client
from michelangelo.lib.serving._description import DeploymentDescription
from michelangelo.lib.serving._endpoints import (
    Deployment,
    app_names,
    end_rollout,
    get_deployment,
    is_ours,
    last_line,
    replica_error,
    run,
    run_apps,
)
from michelangelo.lib.serving._errors import DeploymentError, DeploymentNotFoundError
from michelangelo.lib.serving._rollout import (
    CANARY,
    AutoRollback,
    Rollout,
    canary_app,
    find_record,
    rollout_of,
    start_record,
)


def canary_share(canary: Any, traffic: Any, auto_rollback: Any) -> float | None:
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


def traffic_share(traffic: Any, new_revision: int) -> float:
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


def start_canary(description: DeploymentDescription, share: float,
                  auto_rollback: AutoRollback | None,
                  traffic_revisions: set[int] | None = None) -> Deployment:
    """Run ``description``'s revision beside the live endpoint with ``share`` of its requests."""
    from ray import serve

    from michelangelo.lib.serving._app import build_app

    name = description.name
    if name not in app_names():
        known = sorted(n for n, a in serve.status().applications.items() if is_ours(n, a)) \
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
                and app in app_names()):
            refused = ray.get(record.set_share.remote(
                share, dataclasses.asdict(auto_rollback) if auto_rollback else None))
            if refused is None:
                return get_deployment(name)
        end_rollout(name, f"replaced by a canary of revision {canary.revision_id}")
    try:
        # No route: it answers only what stable replicas send it.
        run_apps([serve.RunTarget(build_app({"description": canary.to_dict()}), name=app,
                                   route_prefix=None)])
    except Exception as exc:
        reason = replica_error(app) or last_line(str(exc)) or type(exc).__name__
        serve.delete(app)
        raise DeploymentError(
            f"the canary {new_name}:{canary.revision_id} of endpoint {name!r} failed readiness, "
            f"so it took no traffic and the endpoint keeps serving revision "
            f"{old.revision_id}: {reason}") from None
    import ray

    record = start_record(name, old.revision_id, canary.revision_id, share, auto_rollback)
    ray.get(record.status.remote())  # replicas find it from now on
    return get_deployment(name)


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
        run(promoted, prove=False)  # it has answered requests already
    except Exception:
        ray.get(record.set_share.remote(rollout.canary_share, None))
        raise
    end_rollout(name, f"promoted to the endpoint's revision {promoted.revision_id}")
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


