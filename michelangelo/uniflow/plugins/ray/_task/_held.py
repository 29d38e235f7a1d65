"""What a Ray task waited for before its body ran, and what it holds while it runs."""

from __future__ import annotations

from michelangelo.uniflow.core import record_phases, record_resources
from michelangelo.uniflow.plugins.ray._capacity import ClusterShape
from michelangelo.uniflow.plugins.ray._task._ray_task import RayTask


def record_holding(config: RayTask, source: str, phase: str, seconds: float) -> None:
    """Record the task's first phase and the resources its RayTask holds.

    What it holds is the RayTask's shape, not the whole cluster: concurrent branches can
    share one cluster, and each is billed for its own shape.
    """
    record_phases(source, [(phase, seconds)])
    total = ClusterShape.from_ray_task(config).total()
    record_resources(cpu=total.get("CPU", 0.0), gpu=total.get("GPU", 0.0),
                     memory_bytes=total.get("memory", 0.0), where=config.describe())
