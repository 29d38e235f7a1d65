"""An existing Ray cluster named by ``RAY_ADDRESS``: borrowed, checked, never torn down."""

from __future__ import annotations

from collections.abc import Callable

from michelangelo.uniflow.plugins.ray._capacity import ClusterShape, check_holds
from michelangelo.uniflow.plugins.ray._clusters._cluster import ClusterState, RayCluster
from michelangelo.uniflow.plugins.ray._task import RayTask


class ExistingRayCluster(RayCluster):
    """Connects to ``address`` and checks that it can hold the RayTask's nodes."""

    def __init__(self, task: RayTask, address: str) -> None:
        self.task = task
        self.address = address
        self._connected_here = False

    def start(self) -> None:
        import ray

        if not ray.is_initialized():
            ray.init(address=self.address, runtime_env=self.task.runtime_env,
                     logging_level="WARNING")
            self._connected_here = True
        try:
            self._check_holds(ClusterShape.from_live_cluster())
        except BaseException:
            self.shutdown()
            raise
        self.dashboard_url = _dashboard_url()
        self.transition(ClusterState.READY)

    def _check_holds(self, live: ClusterShape) -> None:
        check_holds(self.task, live, where=f"RAY_ADDRESS={self.address!r}",
                    fix="shrink the RayTask to the cluster's nodes, or unset RAY_ADDRESS to "
                        "let uniflow start a local cluster of that shape")

    def shape(self) -> ClusterShape:
        return ClusterShape.from_ray_task(self.task)

    def wait_for_nodes(self, timeout_s: float,
                       enough: Callable[[], bool] | None = None) -> None:
        return None  # the check in start() already saw every node

    def shutdown(self) -> None:
        import ray

        if self._connected_here and ray.is_initialized():
            ray.shutdown()
        self.transition(ClusterState.DELETED)


def _dashboard_url() -> str | None:
    try:
        import ray

        url = ray.get_runtime_context().dashboard_url if hasattr(
            ray.get_runtime_context(), "dashboard_url") else None
        if not url:
            url = ray._private.worker.global_worker.node.address_info.get("webui_url")
        if url and not url.startswith("http"):
            url = f"http://{url}"
        return url
    except Exception:
        return None
