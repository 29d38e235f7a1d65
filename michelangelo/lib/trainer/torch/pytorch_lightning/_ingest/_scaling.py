"""How many workers a ``ScalingConfig`` can start."""

from __future__ import annotations

from typing import Any


def max_workers(scaling_config: Any) -> int:
    """The most workers the run can have: ``num_workers``, or the upper bound of an elastic
    ``(min, max)`` pair; at least one."""
    workers = scaling_config.num_workers
    return max(int((workers[1] if isinstance(workers, tuple) else workers) or 1), 1)
