"""The uniflow plugin that runs ``RayTask`` bodies on a Ray cluster of their shape."""

from __future__ import annotations

import contextlib
import logging
import os
import posixpath
import tempfile
from collections.abc import Iterator

from michelangelo.uniflow.core._plugin import TaskPlugin, register_plugin
from michelangelo.uniflow.core._remote import RemoteCall
from michelangelo.uniflow.core._run import Run
from michelangelo.uniflow.core._runtime import current_call
from michelangelo.uniflow.plugins.ray import _failure, _guard, _remote_run
from michelangelo.uniflow.plugins.ray._capacity import active_ray_task
from michelangelo.uniflow.plugins.ray._cluster import RayCluster
from michelangelo.uniflow.plugins.ray._config import RayTask
from michelangelo.uniflow.plugins.ray._provisioners import make_cluster

_KEY = "ray.cluster"


class RayTaskPlugin(TaskPlugin):
    """One cluster per run, reused by every RayTask that fits it, removed when the run ends."""

    def validate(self, config: RayTask) -> None:
        # RayTask validates itself at construction; nothing is left to check here.
        return None

    @contextlib.contextmanager
    def execution(self, config: RayTask, run: Run) -> Iterator[None]:
        if self.runs_elsewhere(config, run):
            _remote_run.prepare(config, run)  # versions, capacity: before any job is sent
            yield
            return
        cluster = self._cluster_for(config, run)
        try:
            with (
                active_ray_task(config),
                _guard.active_cluster(cluster),
                _quiet_ray_data(run),
                _forward_data_warnings(run),
            ):
                yield
        except BaseException as exc:
            _collect_logs(cluster, run, exc if isinstance(exc, Exception) else None)
            raise
        else:
            _collect_logs(cluster, run, None)

    def _cluster_for(self, config: RayTask, run: Run) -> RayCluster:
        cluster: RayCluster | None = run.resources.get(_KEY)
        if cluster is not None and cluster.can_host(config):
            return cluster
        if cluster is not None:
            run.info("the next RayTask does not fit the current cluster; replacing it")
            cluster.shutdown()
            run.resources.pop(_KEY, None)
        cluster = make_cluster(config, run.store.run_dir(run.run_id))
        run.add_cleanup(cluster.shutdown)
        with run.status(f"starting Ray cluster: {config.describe()}"):
            cluster.start()
        run.resources[_KEY] = cluster
        if cluster.dashboard_url:
            run.info(f"Ray dashboard: {cluster.dashboard_url}")
        return cluster

    def describe(self, config: RayTask) -> str:
        return config.describe()

    def runs_elsewhere(self, config: RayTask, run: Run) -> bool:
        return run.mode == "remote-run"

    def run_elsewhere(self, config: RayTask, run: Run, call: RemoteCall) -> None:
        _remote_run.submit(config, run, call)


def _collect_logs(cluster: RayCluster, run: Run, exc: BaseException | None) -> None:
    """Keep the Ray worker logs with the attempt; name the failing worker on ``exc``."""
    call = current_call()
    if call is None:
        return
    if run.storage.is_local:
        folder = posixpath.join(call.call_dir, "logs", f"ray-{call.attempt}")
        cluster.collect_logs(folder)
        _attach_failure(exc, folder)
        return
    if exc is not None and _failure.failed_ranks(exc):
        with tempfile.TemporaryDirectory(prefix="uniflow-ray-logs-") as folder:
            cluster.collect_logs(folder)
            _attach_failure(exc, folder)


def _attach_failure(exc: BaseException | None, folder: str) -> None:
    if exc is None or not os.path.isdir(folder):
        return
    with contextlib.suppress(Exception):  # the summary must never hide the error itself
        detail = _failure.failure_detail(exc, folder, _failure.node_names())
        if detail is not None:
            exc.uniflow_failure_detail = detail  # type: ignore[attr-defined]


@contextlib.contextmanager
def _quiet_ray_data(run: Run) -> Iterator[None]:
    """No Ray Data progress bars while the console is quiet: they only fill the log."""
    if not run.reporter.quiet:
        yield
        return
    from ray.data import DataContext

    context = DataContext.get_current()
    before = (context.enable_progress_bars, context.enable_operator_progress_bars)
    context.enable_progress_bars = False
    context.enable_operator_progress_bars = False
    try:
        yield
    finally:
        context.enable_progress_bars, context.enable_operator_progress_bars = before


class _DataWarnings(logging.Handler):
    """Ray Data warnings about CPUs (a job that would starve) go to the console once."""

    def __init__(self, run: Run) -> None:
        super().__init__(logging.WARNING)
        self.run = run

    def emit(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(Exception):
            message = record.getMessage()
            if "CPU" in message:
                self.run.warn(f"Ray Data: {message.strip().splitlines()[0]}")


@contextlib.contextmanager
def _forward_data_warnings(run: Run) -> Iterator[None]:
    if not run.reporter.quiet:
        yield
        return
    handler = _DataWarnings(run)
    data_logger = logging.getLogger("ray.data")
    data_logger.addHandler(handler)
    try:
        yield
    finally:
        data_logger.removeHandler(handler)


register_plugin(RayTask, RayTaskPlugin())
_guard.install()
