"""Fixtures shared by the LightningTrainer tests.

The tests mirror the trainer's package: one folder per private room (``_config``,
``_strategies``, ``_ingest``, ``_warm_start``, ``_checkpoints``, ``_worker``) with one test
module per module, and the end-to-end tests of the trainer classes here. Helpers shared by
all of them live here too (``_models``, ``_cpu_deepspeed``, ``_documented_models``), imported
as top-level modules (``from _models import ...``): this folder is on ``sys.path`` because
this file is loaded first.

``ray_cluster`` starts a private local Ray for one test module and stops it when the module
is done, so no module shares a cluster with another. A module shapes its cluster with
module attributes:

* ``RAY_NUM_CPUS`` (default 4): logical CPUs, sized to the workers the module's tests start.
* ``RAY_ENV_VARS`` (default none): environment variables for every Ray worker, e.g.
  ``ISOLATED_STATE_API`` (``_models``) for runs that a neighbour's Ray on this shared host
  must not disturb, or ``DEEPSPEED_CPU_ENV`` (``_cpu_deepspeed``) for DeepSpeed on the CPU.
* ``RAY_PRESERVE_ORDER`` (default False): Ray Data hands blocks over in its own order
  (``preserve_order`` is off by default, and on a loaded machine the order does change);
  modules whose tests compare two passes over one dataset pin it for their cluster.

A module whose every test needs the cluster says ``pytestmark =
pytest.mark.usefixtures("ray_cluster")``; the others ask for it by name (directly, or through
a fixture such as ``data``).
"""

from __future__ import annotations

import pytest
import ray
from _models import start_test_ray


@pytest.fixture(scope="module")
def ray_cluster(request):
    module = request.module
    start_test_ray(num_cpus=getattr(module, "RAY_NUM_CPUS", 4),
                   env_vars=getattr(module, "RAY_ENV_VARS", None))
    context = ray.data.DataContext.get_current()
    before = context.execution_options.preserve_order
    if getattr(module, "RAY_PRESERVE_ORDER", False):
        context.execution_options.preserve_order = True
    try:
        yield
    finally:
        context.execution_options.preserve_order = before
        ray.shutdown()
