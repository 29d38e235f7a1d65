"""Serve registered models as Open Inference Protocol endpoints on Ray Serve.

``deploy("project/model@champion")`` resolves the revision, starts replicas that load and
verify it, and returns a :class:`Deployment` with the endpoint's URL.
``deploy(spec, name=..., canary=0.2)`` runs a new revision beside the endpoint's with a share
of its requests; :func:`promote` and :func:`rollback` end that rollout.
"""

from michelangelo.lib.serving._canary import promote, rollback
from michelangelo.lib.serving._deploy import deploy
from michelangelo.lib.serving._description import DeploymentDescription
from michelangelo.lib.serving._endpoints import (
    Deployment,
    delete_deployment,
    get_deployment,
    list_deployments,
)
from michelangelo.lib.serving._errors import (
    DeploymentError,
    DeploymentNotFoundError,
    HTTPError,
    ReadinessError,
    ServingError,
)
from michelangelo.lib.serving._rollout import AutoRollback, Rollout

__all__ = [
    "AutoRollback",
    "Deployment",
    "DeploymentDescription",
    "DeploymentError",
    "DeploymentNotFoundError",
    "HTTPError",
    "ReadinessError",
    "Rollout",
    "ServingError",
    "delete_deployment",
    "deploy",
    "get_deployment",
    "list_deployments",
    "promote",
    "rollback",
]
