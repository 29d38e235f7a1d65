"""The uniflow plugin that runs ``RayTask`` bodies on a Ray cluster of their shape."""

from __future__ import annotations

import contextlib
import logging
import os
import posixpath
import tempfile
import threading
import time
from collections.abc import Iterator

from michelangelo.quantity import format_bytes
from michelangelo.uniflow.core.plugin import (
    RemoteCall,
    Run,
    TaskPlugin,
    current_call,
    register_plugin,
)
from michelangelo.uniflow.plugins.ray import _failure
from michelangelo.uniflow.plugins.ray._capacity import (
    ClusterShape,
    Ledger,
    active_cluster,
    active_ray_task,
    install_capacity_check,
    unplaced_node,
)
from michelangelo.uniflow.plugins.ray._clusters import RayCluster, make_cluster
from michelangelo.uniflow.plugins.ray._remote import (
    plan_remote_concurrency,
    remote_attempt,
    submit_remote,
)
from michelangelo.uniflow.plugins.ray._task import (
    RayTask,
    record_holding,
    refuse_mixed_ray_lightning,
)
from michelangelo.workflow.variables import register_dataset_io

_KEY = "ray.cluster"
_USERS = "ray.cluster.users"  # attempts running on the cluster now
_LEDGER = "ray.cluster.ledger"
_BRANCH_CPU = 1.0  # a Ray task's default: what each branch's Ray work takes at the least


class RayTaskPlugin(TaskPlugin):
    """One cluster per run, reused by every RayTask that fits it, removed when the run ends.

    Concurrent branches share it: one that needs a different cluster waits until the
    branches on the current one are done, and Ray Train fits book their workers in the
    cluster's :class:`Ledger` so that they never oversubscribe it.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()

    def validate(self, config: RayTask) -> None:
        # RayTask validates itself at construction; nothing is left to check here.
        return None

    def check_body(self, config: RayTask, fn: object) -> None:
        refuse_mixed_ray_lightning(fn)

    @contextlib.contextmanager
    def execution(self, config: RayTask, run: Run) -> Iterator[None]:
        if self.runs_elsewhere(config, run):
            with remote_attempt(config, run):  # cluster, versions, capacity: then jobs
                yield
            return
        asked = time.time()
        started_before = run.resources.get(_KEY)
        cluster, ledger = self._acquire(config, run)
        record_holding(config, "Ray cluster",
                       "cluster attach" if cluster is started_before else "cluster start",
                       time.time() - asked)
        try:
            with (
                active_ray_task(config),
                active_cluster(cluster, ledger, run.info),
                _quiet_ray_data(run),
                _forward_data_warnings(run),
            ):
                yield
        except BaseException as exc:
            _collect_logs(cluster, run, exc if isinstance(exc, Exception) else None)
            raise
        else:
            _collect_logs(cluster, run, None)
        finally:
            with self._cond:
                run.resources[_USERS] -= 1
                self._cond.notify_all()

    def _acquire(self, config: RayTask, run: Run) -> tuple[RayCluster, Ledger]:
        """The run's cluster for ``config``, counted as in use until the attempt ends."""
        waited = False
        with self._cond:
            while True:
                cluster: RayCluster | None = run.resources.get(_KEY)
                if (cluster is None or cluster.can_host(config)
                        or not run.resources.get(_USERS)):
                    break
                if not waited:
                    waited = True
                    call = current_call()
                    run.info(f"{call.call_id if call else 'a RayTask'} waits for the branches on "
                             f"the current Ray cluster to end: {config.describe()} does not "
                             "fit it")
                self._cond.wait()
            cluster = self._cluster_for(config, run)
            run.resources[_USERS] = run.resources.get(_USERS, 0) + 1
            return cluster, run.resources[_LEDGER]

    def plan_concurrency(self, configs: list[RayTask], run: Run) -> tuple[int | None, str]:
        if self.runs_elsewhere(configs[0], run):
            return plan_remote_concurrency(configs, run)
        host = next((c for c in configs if all(_holds(c, other) for other in configs)), None)
        if host is None:
            return 1, ("RayTask branches of different shapes, none holding the others: "
                       "one cluster at a time")
        with self._cond:
            cluster = self._cluster_for(host, run)
            ledger: Ledger = run.resources[_LEDGER]
        # What the cluster declares, less what running fits have booked. Ray's live view
        # lags behind tasks that just ended, and would make the count depend on timing.
        free: dict[str, float] = {}
        for node in ledger.free():
            for key, amount in node.items():
                free[key] = free.get(key, 0.0) + max(0.0, amount)
        cpus = free.get("CPU", 0.0)
        memory = free.get("memory")
        shapes = sorted({c.describe() for c in configs})
        at_once = max(1, int(cpus // _BRANCH_CPU + 1e-9))
        return at_once, (
            f"Ray cluster {cluster.shape().describe()} has {cpus:g} free CPU"
            + (f", memory {format_bytes(memory)}" if memory else "")
            + f"; each branch ({'; '.join(shapes)}) takes at least {_BRANCH_CPU:g} CPU, and "
            "a ScalingConfig books its workers when it dispatches")

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
        run.resources[_LEDGER] = Ledger(cluster.shape())
        if cluster.dashboard_url:
            run.info(f"Ray dashboard: {cluster.dashboard_url}")
        return cluster

    def describe(self, config: RayTask) -> str:
        return config.describe()

    def runs_elsewhere(self, config: RayTask, run: Run) -> bool:
        return run.mode == "remote-run"

    def run_elsewhere(self, config: RayTask, run: Run, call: RemoteCall) -> None:
        submit_remote(config, run, call)


def _holds(host: RayTask, other: RayTask) -> bool:
    """Whether a cluster of ``host``'s shape can also run ``other``'s body."""
    if host.runtime_env != other.runtime_env:
        return False
    return unplaced_node(ClusterShape.from_ray_task(other).nodes,
                         ClusterShape.from_ray_task(host).nodes) is None


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


_QUIET_LOCK = threading.Lock()
_QUIETED = 0
_BARS_BEFORE = (True, True)


@contextlib.contextmanager
def _quiet_ray_data(run: Run) -> Iterator[None]:
    """No Ray Data progress bars while the console is quiet: they only fill the log."""
    if not run.reporter.quiet:
        yield
        return
    from ray.data import DataContext

    global _QUIETED, _BARS_BEFORE
    context = DataContext.get_current()
    with _QUIET_LOCK:  # concurrent branches: the first one in saves, the last one out restores
        if _QUIETED == 0:
            _BARS_BEFORE = (context.enable_progress_bars, context.enable_operator_progress_bars)
            context.enable_progress_bars = False
            context.enable_operator_progress_bars = False
        _QUIETED += 1
    try:
        yield
    finally:
        with _QUIET_LOCK:
            _QUIETED -= 1
            if _QUIETED == 0:
                context.enable_progress_bars, context.enable_operator_progress_bars = (
                    _BARS_BEFORE)


class _DataWarnings(logging.Handler):
    """Ray Data warnings about CPUs (a job that would starve) go to the console once."""

    #: How long a "no free CPU" warning waits for the cluster to report one before it is shown.
    recheck_s = 5.0

    def __init__(self, run: Run) -> None:
        super().__init__(logging.WARNING)
        self.run = run

    def emit(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(Exception):
            message = record.getMessage()
            if "CPU" not in message:
                return
            if _NO_FREE_CPU in message and _free_cpus_appear(self.recheck_s):
                # Ray Data read the cluster's free CPUs once, before they were reported (a
                # cluster just started, or a fit that just ended): nothing would hang.
                logging.getLogger(__name__).debug("Ray Data's CPU warning was a stale view")
                return
            self.run.warn(f"Ray Data: {message.strip().splitlines()[0]}")


_NO_FREE_CPU = "does not have any available CPUs"


def _free_cpus_appear(within_s: float) -> bool:
    """Whether the cluster reports a free CPU within ``within_s`` seconds."""
    import ray

    deadline = time.monotonic() + within_s
    while True:
        if ray.available_resources().get("CPU", 0) > 0:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)


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
install_capacity_check()
register_dataset_io()  # RayTasks return Ray Datasets: stored as Parquet, passed as handles
