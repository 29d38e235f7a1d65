"""Ray Data's "no available CPUs" warning reaches the console only when it is true."""

from __future__ import annotations

import logging
import time

import ray

from michelangelo.uniflow.plugins.ray._plugin import _DataWarnings

WARNING = ("Warning: The Ray cluster currently does not have any available CPUs. The Dataset "
           "job will hang unless more CPUs are freed up.")


class _Run:
    def __init__(self) -> None:
        self.warnings: list[str] = []

    def warn(self, message: str) -> None:
        self.warnings.append(message)


class _QuickRecheck(_DataWarnings):
    recheck_s = 1.0


def _emit(handler: logging.Handler) -> None:
    handler.emit(logging.LogRecord("ray.data", logging.WARNING, __file__, 1, WARNING, None, None))


def test_the_cpu_warning_is_shown_only_while_no_cpu_is_free():
    if ray.is_initialized():
        ray.shutdown()
    ray.init(address="local", num_cpus=1, include_dashboard=False,
             object_store_memory=100 * 2**20, log_to_driver=False)
    try:
        run = _Run()
        # A free CPU (as when Ray Data read the free CPUs before a new node reported them):
        # nothing would hang, so nothing is shown.
        _emit(_QuickRecheck(run))
        assert run.warnings == []
        # Every CPU held (as by a fit's workers): the warning is true and is shown.
        holder = ray.remote(num_cpus=1)(type("Holder", (), {"ping": lambda self: 1})).remote()
        ray.get(holder.ping.remote())
        deadline = time.monotonic() + 120  # until the cluster's own view says so
        while ray.available_resources().get("CPU", 0) > 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        _emit(_QuickRecheck(run))
        assert run.warnings == [f"Ray Data: {WARNING}"]
    finally:
        ray.shutdown()
