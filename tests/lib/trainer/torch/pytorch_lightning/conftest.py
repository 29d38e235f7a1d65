"""Fixtures shared by the LightningTrainer tests.

The tests mirror the trainer's package: one folder per private room (``_config``,
``_strategies``, ``_ingest``, ``_warm_start``, ``_checkpoints``, ``_worker``) with one test
module per module, and the end-to-end tests of the trainer classes here. Helpers shared by
all of them live here too (``_models``, ``_cpu_deepspeed``, ``_documented_models``), imported
as top-level modules (``from _models import ...``): this folder is on ``sys.path`` because
this file is loaded first.

``ray_cluster`` gives a module a local Ray of its own shape. Starting one costs seconds, so
modules of the same shape share it: the Ray stays up after a module and the next module of that
shape reuses it; a module of another shape gets a fresh one, and the Ray stops when the run
leaves this folder. The modules here are run grouped by shape (``pytest_collection_modifyitems``)
so that each shape starts once. A module shapes its cluster with module attributes:

* ``RAY_NUM_CPUS`` (default 4): logical CPUs, sized to the workers the module's tests start.
* ``RAY_ENV_VARS`` (default none): environment variables for every Ray worker, e.g.
  ``ISOLATED_STATE_API`` (``_models``) for runs that a neighbour's Ray on this shared host
  must not disturb, or ``DEEPSPEED_CPU_ENV`` (``_cpu_deepspeed``) for DeepSpeed on the CPU.
* ``RAY_PRESERVE_ORDER`` (default False): Ray Data hands blocks over in its own order
  (``preserve_order`` is off by default, and on a loaded machine the order does change);
  modules whose tests compare two passes over one dataset pin it for their module.

A fixture that starts a Ray cluster of its own asks for ``no_shared_ray`` first.

A module whose every test needs the cluster says ``pytestmark =
pytest.mark.usefixtures("ray_cluster")``; the others ask for it by name (directly, or through
a fixture such as ``data``).
"""

from __future__ import annotations

import os

import pytest
import ray
from _models import start_test_ray

HERE = os.path.dirname(os.path.abspath(__file__))
# The shape of the local Ray this process runs for these tests, or None when none runs.
_running_shape: tuple | None = None


def _shape(module) -> tuple:
    env = getattr(module, "RAY_ENV_VARS", None) or {}
    return (getattr(module, "RAY_NUM_CPUS", 4), tuple(sorted(env.items())))


def _stop_shared_ray() -> None:
    global _running_shape
    _running_shape = None
    if ray.is_initialized():
        ray.shutdown()


def _in_this_folder(item) -> bool:
    return str(item.path).startswith(HERE + os.sep)


def pytest_collection_modifyitems(session, config, items):
    # Run this folder's modules grouped by their Ray's shape, each module's tests kept in
    # order; modules whose tests need no Ray go first. Items elsewhere keep their places.
    positions = [i for i, item in enumerate(items) if _in_this_folder(item)]
    if not positions:
        return
    mine = [items[i] for i in positions]
    needs_ray = {item.module for item in mine if "ray_cluster" in item.fixturenames}
    order: dict = {}
    for item in mine:
        order.setdefault(item.module, len(order))

    def key(item):
        module = item.module
        return ((1, _shape(module)) if module in needs_ray else (0, ()), order[module])

    for i, item in zip(positions, sorted(mine, key=key), strict=True):
        items[i] = item


def pytest_runtest_teardown(item, nextitem):
    if nextitem is None or not _in_this_folder(nextitem):
        _stop_shared_ray()


@pytest.fixture(scope="module")
def no_shared_ray():
    """Stop the shared local Ray, for a fixture that starts a cluster of its own."""
    _stop_shared_ray()


@pytest.fixture(scope="module")
def ray_cluster(request):
    global _running_shape
    module = request.module
    shape = _shape(module)
    if not (ray.is_initialized() and _running_shape == shape):
        start_test_ray(num_cpus=shape[0], env_vars=dict(shape[1]) or None)
        _running_shape = shape
    context = ray.data.DataContext.get_current()
    before = context.execution_options.preserve_order
    if getattr(module, "RAY_PRESERVE_ORDER", False):
        context.execution_options.preserve_order = True
    try:
        yield
    finally:
        context.execution_options.preserve_order = before
