"""``RayTask``: the shape of the Ray cluster a uniflow task runs on."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from michelangelo.errors import InputError
from michelangelo.quantity import parse_bytes, parse_quantity

_UNSET = None


@dataclass(frozen=True)
class RayTask:
    """Cluster shape for a ``@uniflow.task``: one head node plus ``worker_instances`` workers.

    Quantities use Kubernetes notation (``"8Gi"``, ``"512Mi"``, ``"2G"``) or plain numbers
    (bytes for memory and disk). They are parsed once, here; the parsed values are on the
    ``*_bytes`` / ``*_cpus`` properties. Every field shapes both the local cluster and the
    KubeRay ``RayCluster`` manifest.

    Args:
        head_cpu: Logical CPUs of the head node (fractions allowed, e.g. ``"500m"``).
        head_memory: Memory of the head node.
        head_gpu: GPUs of the head node.
        head_disk: Disk (ephemeral storage) of the head node.
        head_object_store_memory: Ray object store size on the head node.
        worker_cpu: Logical CPUs of each worker node.
        worker_memory: Memory of each worker node.
        worker_gpu: GPUs of each worker node.
        worker_disk: Disk (ephemeral storage) of each worker node.
        worker_object_store_memory: Ray object store size on each worker node.
        worker_instances: Number of worker nodes.
        runtime_env: Ray runtime environment applied to the task's Ray job.

    Raises:
        ValueError: When a field has a value that is not a valid quantity or count.
    """

    head_cpu: Any = 1
    head_memory: Any = None
    head_gpu: Any = 0
    head_disk: Any = None
    head_object_store_memory: Any = None
    worker_cpu: Any = 1
    worker_memory: Any = None
    worker_gpu: Any = 0
    worker_disk: Any = None
    worker_object_store_memory: Any = None
    worker_instances: int = 0
    runtime_env: dict | None = None
    _parsed: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        parsed: dict[str, Any] = {}
        for role in ("head", "worker"):
            parsed[f"{role}_cpu"] = _cpus(getattr(self, f"{role}_cpu"), f"{role}_cpu")
            parsed[f"{role}_gpu"] = _count(getattr(self, f"{role}_gpu"), f"{role}_gpu")
            for name in ("memory", "disk", "object_store_memory"):
                key = f"{role}_{name}"
                raw = getattr(self, key)
                parsed[key] = None if raw is _UNSET else parse_bytes(raw, field=f"RayTask.{key}")
            osm = parsed[f"{role}_object_store_memory"]
            if osm is not None and osm < 75 * 2**20:
                raise InputError(
                    f"RayTask.{role}_object_store_memory={getattr(self, f'{role}_object_store_memory')!r}"
                    " is below Ray's minimum object store of 75Mi. Use at least '75Mi'."
                )
            mem = parsed[f"{role}_memory"]
            if osm is not None and mem is not None and osm > mem:
                raise InputError(
                    f"RayTask.{role}_object_store_memory={getattr(self, f'{role}_object_store_memory')!r}"
                    f" exceeds {role}_memory={getattr(self, f'{role}_memory')!r}: the object store "
                    f"lives inside the node's memory. Lower it or raise {role}_memory."
                )
        if isinstance(self.worker_instances, bool) or not isinstance(self.worker_instances, int):
            raise InputError(
                f"RayTask.worker_instances={self.worker_instances!r} must be a whole number of "
                "worker nodes, e.g. worker_instances=2."
            )
        if self.worker_instances < 0:
            raise InputError(
                f"RayTask.worker_instances={self.worker_instances!r} must be 0 or more."
            )
        if self.runtime_env is not None and not isinstance(self.runtime_env, dict):
            raise InputError(
                f"RayTask.runtime_env={self.runtime_env!r} must be a dict such as "
                "{'env_vars': {'KEY': 'value'}, 'pip': [...]}."
            )
        object.__setattr__(self, "_parsed", parsed)

    def parsed(self, key: str) -> Any:
        """The parsed value of a field: CPUs as float, GPUs as int, quantities in bytes."""
        return self._parsed[key]

    def check(self, scaling_config: Any) -> None:
        """Check that a Ray Train ``ScalingConfig`` fits this cluster shape.

        Raises:
            CapacityError: If the workers cannot all be placed on the declared nodes.
        """
        from michelangelo.uniflow.plugins.ray._capacity import ClusterShape, check_fits

        check_fits(scaling_config, ClusterShape.from_ray_task(self))

    def describe(self) -> str:
        """A short human description, e.g. ``head 2 CPU + 4 x worker 4 CPU``."""
        from michelangelo.uniflow.plugins.ray._capacity import ClusterShape

        return ClusterShape.from_ray_task(self).describe()


def _cpus(value: Any, field: str) -> float:
    amount = parse_quantity(value, field=f"RayTask.{field}")
    return float(amount)


def _count(value: Any, field: str) -> int:
    amount = parse_quantity(value, field=f"RayTask.{field}")
    if amount != amount.to_integral_value():
        raise InputError(
            f"RayTask.{field}={value!r} must be a whole number of GPUs, e.g. {field}=1."
        )
    return int(amount)


__all__ = ["RayTask"]
