"""What one node of a ``RayTask`` cluster advertises to Ray, wherever it runs.

The local provisioner turns this into ``ray start`` flags and the KubeRay manifest into
``rayStartParams`` plus container requests; both read the same :class:`NodeResources`, so a
field cannot reach one kind of cluster and be dropped on the way to the other.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from michelangelo.errors import InputError
from michelangelo.uniflow.plugins.ray._task._ray_task import RayTask

DEFAULT_OBJECT_STORE = {"head": 512 * 2**20, "worker": 256 * 2**20}
MIN_OBJECT_STORE = 75 * 2**20
ROLES = ("head", "worker")


@dataclass(frozen=True)
class NodeResources:
    """The logical resources of one node.

    Attributes:
        cpus: CPUs as declared (may be fractional, e.g. 0.5 for ``"500m"``).
        gpus: Whole GPUs.
        memory: Memory in bytes, or None when the RayTask leaves it to Ray.
        object_store_memory: Object store size in bytes (a default when the RayTask has none).
        disk: Disk in bytes, advertised as the custom ``disk`` resource; None when unset.
    """

    cpus: float
    gpus: int
    memory: int | None
    object_store_memory: int
    disk: int | None

    @property
    def ray_cpus(self) -> int:
        """Whole CPUs for ``ray start``: a fractional head still needs one slot."""
        if float(self.cpus).is_integer():
            return max(int(self.cpus), 0)
        return max(int(self.cpus + 0.999), 1)

    @property
    def custom_resources(self) -> dict[str, int]:
        # Ray has no disk resource; a custom one lets tasks ask for it and keeps the shape honest.
        return {"disk": self.disk} if self.disk is not None else {}

    def start_params(self) -> dict[str, str]:
        """``ray start`` options without their leading dashes, values as strings."""
        params = {
            "num-cpus": str(self.ray_cpus),
            "num-gpus": str(self.gpus),
            "object-store-memory": str(self.object_store_memory),
        }
        if self.memory is not None:
            params["memory"] = str(self.memory)
        if self.custom_resources:
            params["resources"] = json.dumps(self.custom_resources, sort_keys=True)
        return params

    def start_flags(self) -> list[str]:
        """The same options as ``--name=value`` flags for a local ``ray start``."""
        return [f"--{key}={value}" for key, value in self.start_params().items()]


def node_resources(task: RayTask, role: str) -> NodeResources:
    """The resources the ``role`` (``"head"`` or ``"worker"``) node of ``task`` advertises."""
    if role not in ROLES:
        raise InputError(f"role={role!r} must be one of {list(ROLES)}.")
    memory = task.parsed(f"{role}_memory")
    object_store = task.parsed(f"{role}_object_store_memory") or DEFAULT_OBJECT_STORE[role]
    if memory is not None:
        object_store = min(object_store, memory)
    return NodeResources(
        cpus=task.parsed(f"{role}_cpu"),
        gpus=task.parsed(f"{role}_gpu"),
        memory=memory,
        object_store_memory=max(object_store, MIN_OBJECT_STORE),
        disk=task.parsed(f"{role}_disk"),
    )
