"""What a task asks of Ray: the ``RayTask`` and what follows from it.

``_ray_task``: the RayTask itself, checked when it is made; ``_node_resources``: the
resources each of its nodes starts with; ``_run_config``: Ray Train's ``RunConfig`` for a
run's storage; ``_held``: what a task waited for and holds, for the run's record;
``_lightning_classes``: a body that mixes Ray's Lightning classes with the other package.
"""

from __future__ import annotations

from michelangelo.uniflow.plugins.ray._task._held import (
    record_holding,
)
from michelangelo.uniflow.plugins.ray._task._lightning_classes import (
    refuse_mixed_ray_lightning,
)
from michelangelo.uniflow.plugins.ray._task._node_resources import (
    NodeResources,
    node_resources,
)
from michelangelo.uniflow.plugins.ray._task._ray_task import (
    RayTask,
)
from michelangelo.uniflow.plugins.ray._task._run_config import (
    create_run_config,
)

__all__ = [
    "NodeResources",
    "RayTask",
    "create_run_config",
    "node_resources",
    "record_holding",
    "refuse_mixed_ray_lightning",
]
