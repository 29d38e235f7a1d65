"""The uniflow plugin that runs ``RayTask`` bodies on a Ray cluster of their shape."""

from __future__ import annotations

import contextlib
import posixpath
from collections.abc import Iterator

from michelangelo.uniflow.core._plugin import TaskPlugin, register_plugin
from michelangelo.uniflow.core._run import Run
from michelangelo.uniflow.core._runtime import current_call
from michelangelo.uniflow.plugins.ray import _guard
from michelangelo.uniflow.plugins.ray._capacity import active_ray_task
from michelangelo.uniflow.plugins.ray._cluster import RayCluster
from michelangelo.uniflow.plugins.ray._config import RayTask
from michelangelo.uniflow.plugins.ray._provisioners import make_cluster

_KEY = "ray.cluster"


class RayTaskPlugin(TaskPlugin):
    """One cluster per run, reused by every RayTask that fits it, removed when the run ends."""

    def validate(self, config: RayTask) -> None:
        # RayTask validates itself at construction; nothing is left to check here.
        return None

    @contextlib.contextmanager
    def execution(self, config: RayTask, run: Run) -> Iterator[None]:
        cluster = self._cluster_for(config, run)
        try:
            with active_ray_task(config), _guard.active_cluster(cluster):
                yield
        finally:
            call = current_call()
            if call is not None and run.storage.is_local:
                cluster.collect_logs(posixpath.join(call.call_dir, "logs", f"ray-{call.attempt}"))

    def _cluster_for(self, config: RayTask, run: Run) -> RayCluster:
        cluster: RayCluster | None = run.resources.get(_KEY)
        if cluster is not None and cluster.can_host(config):
            return cluster
        if cluster is not None:
            run.info("the next RayTask does not fit the current cluster; replacing it")
            cluster.shutdown()
            run.resources.pop(_KEY, None)
        cluster = make_cluster(config, run.store.run_dir(run.run_id))
        run.add_cleanup(cluster.shutdown)
        with run.status(f"starting Ray cluster: {config.describe()}"):
            cluster.start()
        run.resources[_KEY] = cluster
        if cluster.dashboard_url:
            run.info(f"Ray dashboard: {cluster.dashboard_url}")
        return cluster

    def describe(self, config: RayTask) -> str:
        return config.describe()


register_plugin(RayTask, RayTaskPlugin())
_guard.install()
