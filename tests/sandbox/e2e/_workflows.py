"""Workflows the sandbox's end-to-end tests run with ``michelangelo run ... --kuberay --sandbox``."""

from __future__ import annotations

import michelangelo.uniflow.core as uniflow
from michelangelo.uniflow.plugins.ray import RayTask

# More memory per worker than the sandbox's one node has: refused before any pod is made.
TOO_BIG = RayTask(head_cpu=1, head_memory="1Gi", worker_cpu=1, worker_memory="512Gi",
                  worker_instances=1)


@uniflow.task(config=TOO_BIG)
def oversized() -> str:
    return "never runs"


@uniflow.workflow()
def too_big() -> str:
    return oversized()
