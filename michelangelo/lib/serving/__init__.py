"""Serve registered models as Open Inference Protocol endpoints on Ray Serve.

``deploy("project/model@champion")`` resolves the revision, starts replicas that load and
verify it, and returns a :class:`Deployment` with the endpoint's URL.
"""

from michelangelo.lib.serving._deploy import (
    Deployment,
    delete_deployment,
    deploy,
    get_deployment,
    list_deployments,
)
from michelangelo.lib.serving._description import DeploymentDescription
from michelangelo.lib.serving._errors import (
    DeploymentError,
    DeploymentNotFoundError,
    HTTPError,
    ReadinessError,
    ServingError,
)

__all__ = [
    "Deployment",
    "DeploymentDescription",
    "DeploymentError",
    "DeploymentNotFoundError",
    "HTTPError",
    "ReadinessError",
    "ServingError",
    "delete_deployment",
    "deploy",
    "get_deployment",
    "list_deployments",
]
