"""Which provisioner makes the cluster for a RayTask: a small registry.

``RAY_ADDRESS`` set: borrow that cluster; likewise a standing one from ``michelangelo cluster
up`` unless a provisioner is named. Otherwise ``UF_RAY_PROVISIONER`` names one
(``local`` by default).

remote-run has a second registry: a *run provisioner* makes the clusters of a whole run when
its options ask for one (KubeRay registers itself there for ``--kuberay``). Extensions such as
KubeRay are found through the ``michelangelo.uniflow.plugins.ray`` entry point group, so this
plugin never imports them: they import it and join its registries.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
from collections.abc import Callable
from typing import Any, Protocol

from michelangelo.uniflow.core.errors import UserError
from michelangelo.uniflow.core.plugin import Run
from michelangelo.uniflow.plugins.ray._clusters._cluster import RayCluster
from michelangelo.uniflow.plugins.ray._task import RayTask

Provisioner = Callable[[RayTask, str], RayCluster]
_PROVISIONERS: dict[str, Provisioner] = {}


def register_provisioner(name: str, factory: Provisioner) -> None:
    """Make ``factory(task, log_dir)`` available as ``UF_RAY_PROVISIONER=name``."""
    _PROVISIONERS[name] = factory


def make_cluster(task: RayTask, run_dir: str) -> RayCluster:
    log_dir = posixpath.join(run_dir, "ray-cluster")
    address = os.environ.get("RAY_ADDRESS")
    if address:
        from michelangelo.uniflow.plugins.ray._clusters._existing import ExistingRayCluster

        return ExistingRayCluster(task, address)
    if "UF_RAY_PROVISIONER" not in os.environ:
        # A standing cluster (`michelangelo cluster up`) is borrowed like RAY_ADDRESS.
        from michelangelo.uniflow.plugins.ray._clusters import _standing

        standing = _standing.find()
        if standing is not None:
            from michelangelo.uniflow.plugins.ray._clusters._existing import ExistingRayCluster

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
    from michelangelo.uniflow.plugins.ray._clusters._local import LocalRayCluster

    return LocalRayCluster(task, log_dir)


register_provisioner("local", _local)


ENTRY_POINT_GROUP = "michelangelo.uniflow.plugins.ray"


class RunClusters(Protocol):
    """The clusters one remote run's RayTasks are sent to, made by a run provisioner."""

    def lease(self, config: RayTask, task_name: str,
              holder: str) -> contextlib.AbstractContextManager[str]:
        """A ready cluster that can hold ``config``, for ``holder`` (a call id) alone.

        Entering yields its Jobs API address; the cluster is the holder's until the block
        ends (then a later RayTask may reuse it).
        """

    def plan_concurrency(self, configs: list[RayTask]) -> tuple[int, str]:
        """How many branches of ``configs`` run at once, and the reason in words."""

    def auth_headers(self, address: str) -> dict[str, str]:
        """Headers the Jobs API at ``address`` (a leased cluster's) needs with every request,
        such as its token; empty when it needs none. Never printed."""

    def publish(self, deployments: list[dict[str, Any]], config: RayTask, call_id: str,
                project: Any) -> None:
        """Make the endpoints a task deployed on its cluster outlive the run."""


RunProvisioner = Callable[[Run], "RunClusters | None"]
_RUN_PROVISIONERS: dict[str, RunProvisioner] = {}


def register_run_provisioner(name: str, factory: RunProvisioner) -> None:
    """Let ``factory(run)`` make the clusters of remote runs whose options ask for them.

    Args:
        name: The provisioner's name (e.g. ``"kuberay"``); registering it again replaces it.
        factory: Returns the run's :class:`RunClusters` when ``run.options`` select this
            provisioner, else ``None``. It registers its own cleanup with ``run.add_cleanup``.
    """
    _RUN_PROVISIONERS[name] = factory


def run_clusters_for(run: Run) -> RunClusters | None:
    """The clusters the first run provisioner that ``run``'s options select makes, if any."""
    for factory in _RUN_PROVISIONERS.values():
        clusters = factory(run)
        if clusters is not None:
            return clusters
    return None


def load_extensions() -> None:
    """Import the extensions installed under the ``michelangelo.uniflow.plugins.ray`` group.

    Each one registers its provisioners and run options when imported.
    """
    from importlib.metadata import entry_points

    for entry in entry_points(group=ENTRY_POINT_GROUP):
        entry.load()
