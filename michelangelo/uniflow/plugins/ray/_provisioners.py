"""Which provisioner makes the cluster for a RayTask: a small registry.

``RAY_ADDRESS`` set: borrow that cluster; likewise a standing one from ``michelangelo cluster
up`` unless a provisioner is named. Otherwise ``UF_RAY_PROVISIONER`` names one
(``local`` by default); the KubeRay provisioner joins the registry under ``kuberay``.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Callable

from michelangelo.uniflow.core.errors import UserError
from michelangelo.uniflow.plugins.ray._cluster import RayCluster
from michelangelo.uniflow.plugins.ray._config import RayTask

Provisioner = Callable[[RayTask, str], RayCluster]
_PROVISIONERS: dict[str, Provisioner] = {}


def register_provisioner(name: str, factory: Provisioner) -> None:
    """Make ``factory(task, log_dir)`` available as ``UF_RAY_PROVISIONER=name``."""
    _PROVISIONERS[name] = factory


def make_cluster(task: RayTask, run_dir: str) -> RayCluster:
    log_dir = posixpath.join(run_dir, "ray-cluster")
    address = os.environ.get("RAY_ADDRESS")
    if address:
        from michelangelo.uniflow.plugins.ray._existing import ExistingRayCluster

        return ExistingRayCluster(task, address)
    if "UF_RAY_PROVISIONER" not in os.environ:
        # A standing cluster (`michelangelo cluster up`) is borrowed like RAY_ADDRESS.
        from michelangelo.uniflow.plugins.ray import _standing

        standing = _standing.find()
        if standing is not None:
            from michelangelo.uniflow.plugins.ray._existing import ExistingRayCluster

            _standing.use_auth_of(standing)
            return ExistingRayCluster(task, standing.address)
    name = os.environ.get("UF_RAY_PROVISIONER", "local")
    if name not in _PROVISIONERS:
        raise UserError(
            f"UF_RAY_PROVISIONER={name!r} is not a known provisioner; choose one of "
            f"{sorted(_PROVISIONERS)}."
        )
    return _PROVISIONERS[name](task, log_dir)


def _local(task: RayTask, log_dir: str) -> RayCluster:
    from michelangelo.uniflow.plugins.ray._local import LocalRayCluster

    return LocalRayCluster(task, log_dir)


register_provisioner("local", _local)
