"""remote-run: every RayTask attempt becomes a Ray job on an existing cluster.

``python wf.py remote-run --ray-address http://HOST:8265`` (or ``michelangelo run FILE:WF
--ray-address ...``). Per run, once: the address is checked, the client's and the cluster's
Ray and Python versions are compared, and the project folder is zipped. Per RayTask shape,
once: the shape is checked against the cluster's live nodes. Per cluster, once, before its
first task job: a probe job finds whether the jobs' python has this SDK (``_sdk_probe``);
when only the SDK is missing, every job carries this client's copy of it. Per attempt: a job whose
entrypoint (``_entry``) runs the body from the call description uniflow stored.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

from michelangelo.settings import set_in_environment
from michelangelo.uniflow.core.errors import UserError
from michelangelo.uniflow.core.plugin import (
    RemoteCall,
    Run,
    RunOption,
    current_call,
    register_run_option,
)
from michelangelo.uniflow.plugins.ray._capacity import ClusterShape
from michelangelo.uniflow.plugins.ray._clusters import run_clusters_for
from michelangelo.uniflow.plugins.ray._remote._jobs import JobFailedError, JobsCluster
from michelangelo.uniflow.plugins.ray._remote._sdk_probe import (
    client_package_dir,
    client_version,
    needs_shipping,
    parse_probe,
    probe_entrypoint,
)
from michelangelo.uniflow.plugins.ray._remote._working_dir import (
    PackedProject,
    pack_project,
    project_root,
)
from michelangelo.uniflow.plugins.ray._task import RayTask, record_holding

OPTION = "ray_address"
ENV_JOB_PYTHON = "UF_RAY_JOB_PYTHON"
ENV_START_GRACE = "UF_RAY_JOB_START_GRACE_S"
_KEY = "ray.jobs"


def address_of(run_options: dict[str, Any]) -> str | None:
    """``--ray-address``, else ``RAY_ADDRESS`` when it is a dashboard (http) URL."""
    address = run_options.get(OPTION)
    if address:
        return address
    env = os.environ.get("RAY_ADDRESS", "")
    return env if env.startswith(("http://", "https://")) else None


def _check_option(mode: str, value: Any, options: dict[str, Any]) -> None:
    if mode != "remote-run":
        if value:
            raise UserError(
                f"--ray-address {value!r} only applies to remote-run: run "
                "`python wf.py remote-run --ray-address URL` (the michelangelo CLI switches "
                "to remote-run by itself when --ray-address is given)."
            )
        return
    if options.get("kuberay"):
        return  # the KubeRay option checks the pair
    address = value or address_of({})
    if not address:
        raise UserError(
            "remote-run needs the Ray cluster's dashboard address: pass --ray-address "
            "http://HOST:8265 (or set RAY_ADDRESS=http://HOST:8265)."
        )
    if not re.match(r"^https?://[^/\s]+", address):
        raise UserError(
            f"--ray-address {address!r} is not an http(s) URL. remote-run talks to the Ray Jobs "
            "API on the dashboard port: write e.g. --ray-address http://10.0.0.5:8265."
        )


register_run_option(RunOption(
    name=OPTION,
    flag="--ray-address",
    metavar="URL",
    help="remote-run: the Ray dashboard (Jobs API) URL, e.g. http://HOST:8265",
    check=_check_option,
))


class _RemoteState:
    """What one run keeps for its remote jobs: the cluster client and the packed project."""

    def __init__(self, run: Run) -> None:
        address = address_of(run.options)
        self.provisioned = run_clusters_for(run)  # e.g. --kuberay: a cluster per RayTask
        if not address and self.provisioned is None:  # Context checks this; a Run made by hand may not
            raise UserError("remote-run needs --ray-address http://HOST:8265.")
        if run.storage.url.startswith("memory://"):
            raise UserError(
                f"remote-run with storage {run.storage.url!r}: memory:// lives inside this "
                "process, so the cluster cannot read inputs or write results there. Use "
                "--storage-url with a place both can reach (s3://..., gs://..., a shared folder)."
            )
        self.run = run
        self._fixed: JobsCluster | None = None  # --ray-address: every job goes there
        # (address, request headers) -> its client, versions checked
        self._clients: dict[tuple[str, tuple[tuple[str, str], ...]], JobsCluster] = {}
        # With a run provisioner each branch's attempt has its own cluster: per thread.
        self._branch = threading.local()
        self._ship_sdk: dict[str, bool] = {}  # cluster address -> jobs carry this SDK
        self.packed: PackedProject | None = None
        self._scratch = tempfile.mkdtemp(prefix="uf-remote-")
        # Concurrent branches share this state: one packing at a time, and per cluster one
        # job at a time setting up its runtime env (see JobsCluster.run_job).
        self._lock = threading.Lock()
        self._setup_gates: dict[str, threading.Lock] = {}
        self._probe_lock = threading.Lock()
        self._clients_lock = threading.Lock()
        if address:
            self._fixed = self.client(address)

    @property
    def cluster(self) -> JobsCluster | None:
        """The cluster this thread's attempt sends its job to."""
        return getattr(self._branch, "cluster", None) or self._fixed

    def client(self, address: str) -> JobsCluster:
        """The Jobs API client of the cluster at ``address`` (versions checked once)."""
        headers = self.provisioned.auth_headers(address) if self.provisioned else {}
        # A later cluster may come back at an address an earlier one had, with its own token.
        key = (address.rstrip("/"), tuple(sorted(headers.items())))
        with self._clients_lock:
            if key not in self._clients:
                cluster = JobsCluster(address, headers=headers or None)
                cluster.check_versions()
                self._clients[key] = cluster
            return self._clients[key]

    @contextlib.contextmanager
    def provisioned_cluster(self, config: RayTask, task_name: str,
                            holder: str) -> Iterator[JobsCluster]:
        """A cluster of the run provisioner's, this thread's until the block ends."""
        assert self.provisioned is not None
        with self.provisioned.lease(config, task_name, holder) as address:
            self._branch.cluster = self.client(address)
            try:
                yield self._branch.cluster
            finally:
                self._branch.cluster = None

    def ship_sdk(self, cluster: JobsCluster) -> bool:
        """Whether jobs on ``cluster`` must carry this client's SDK (raises when that won't do).

        Probed once per cluster, just before its first task job (after the capacity check,
        so a task that can never fit submits nothing).
        """
        with self._probe_lock:  # branches at once: one probe job per cluster
            if cluster.address not in self._ship_sdk:
                try:
                    self._ship_sdk[cluster.address] = self._check_sdk(cluster)
                except Exception as exc:
                    exc.uniflow_retryable = False  # type: ignore[attr-defined]  # stays wrong
                    raise
            return self._ship_sdk[cluster.address]

    def _check_sdk(self, cluster: JobsCluster) -> bool:
        python = os.environ.get(ENV_JOB_PYTHON, "python")
        found = parse_probe(cluster.probe(probe_entrypoint(python)))
        if found is None:
            raise UserError(
                f"the SDK check job on {cluster.address} printed no report, so {python!r} there "
                f"may not be a Python. Fix: set {ENV_JOB_PYTHON} to the cluster's python.")
        ship = needs_shipping(found, address=cluster.address, python_env=ENV_JOB_PYTHON)
        if ship:
            have = f"michelangelo {found.version}" if found.version else "no michelangelo"
            self.run.info(f"remote-run: {found.python} on {cluster.address} has {have}; each "
                          f"job carries this client's michelangelo {client_version()} "
                          "(runtime_env py_modules)")
        return ship

    def project(self, source_file: str) -> PackedProject:
        root = project_root(source_file)
        with self._lock:
            if self.packed is None or self.packed.root != root:
                self.packed = pack_project(root, self._scratch)
            return self.packed

    def setup_gate(self, cluster: JobsCluster) -> threading.Lock:
        """The lock jobs on ``cluster`` hold while Ray sets up their environment."""
        with self._lock:
            return self._setup_gates.setdefault(cluster.address, threading.Lock())

    def close(self) -> None:
        import shutil

        shutil.rmtree(self._scratch, ignore_errors=True)


_STATE_LOCK = threading.Lock()


def _state(run: Run) -> _RemoteState:
    with _STATE_LOCK:  # concurrent branches reach here at once
        state = run.resources.get(_KEY)
        if state is None:
            state = _RemoteState(run)
            run.resources[_KEY] = state
            run.add_cleanup(state.close)
            where = state.cluster.address if state.cluster else "a KubeRay RayCluster per RayTask"
            run.info(f"remote-run: RayTask bodies run as Ray jobs on {where}")
        return state


def plan_concurrency(configs: list[RayTask], run: Run) -> tuple[int, str]:
    """How many RayTask branches run as jobs at once on the ``--ray-address`` cluster.

    As many copies of the largest branch's nodes (head and workers, summed per resource) as
    the cluster's live totals hold, at least one; a branch that can never fit still fails
    alone in its own capacity check.
    """
    state = _state(run)
    if state.provisioned is not None:
        return state.provisioned.plan_concurrency(configs)
    assert state.cluster is not None
    live = state.cluster.live_shape()
    total = live.total()
    need: dict[str, float] = {}
    for config in configs:
        for key, amount in ClusterShape.from_ray_task(config).total().items():
            need[key] = max(need.get(key, 0.0), amount)
    copies = [int(total.get(key, 0.0) // amount + 1e-9) for key, amount in need.items()
              if amount > 0]
    at_once = max(1, min(copies) if copies else len(configs))
    shapes = "; ".join(sorted({c.describe() for c in configs}))
    return at_once, (f"remote-run: {live.describe()} holds {at_once} branch(es) of "
                     f"{shapes} at once, each a Ray job")


@contextlib.contextmanager
def attempt(config: RayTask, run: Run) -> Iterator[None]:
    """Around an attempt: its cluster (with a run provisioner, the branch's own, held until
    the attempt ends), versions (once per cluster), the shape against the live nodes."""
    with contextlib.ExitStack() as stack:
        try:
            state = _state(run)
            if state.provisioned is not None:
                call = current_call()
                stack.enter_context(state.provisioned_cluster(
                    config, call.task_name if call else "task",
                    call.call_id if call else "a RayTask"))
            assert state.cluster is not None
            state.cluster.check_capacity(config)
        except Exception as exc:
            # A wrong address, token, version or shape stays wrong: retrying cannot help.
            exc.uniflow_retryable = False  # type: ignore[attr-defined]
            raise
        yield


def submit(config: RayTask, run: Run, call: RemoteCall) -> None:
    """Run one attempt as a Ray job; its output streams here and into the attempt's log."""
    state = _state(run)
    packed = state.project(call.source_file)
    source = os.path.relpath(call.source_file, packed.root)
    if source.startswith(".."):
        raise UserError(
            f"task {call.task_name!r} is defined in {call.source_file}, outside the project "
            f"folder {packed.root} that travels to the cluster. Move the file into the project "
            "or set UF_RAY_WORKING_DIR to a folder that holds both."
        )
    runtime_env = dict(config.runtime_env or {})
    if "working_dir" in runtime_env:
        raise UserError(
            f"RayTask(runtime_env={config.runtime_env!r}): remote-run sends the project folder "
            "as the job's working_dir itself; drop 'working_dir' (use py_modules for more code)."
        )
    runtime_env["working_dir"] = packed.zip_path
    cluster = state.cluster  # this attempt's (with --kuberay, the branch's own)
    assert cluster is not None
    if state.ship_sdk(cluster):
        runtime_env["py_modules"] = [*runtime_env.get("py_modules", []), client_package_dir()]
    # The job sees the run's storage as this process does, so libraries that default to a
    # place under it (the model registry) find the same things on both sides; and the SDK's
    # settings this process set (and checked when the run started) apply there too.
    shared = {**set_in_environment(), "UF_STORAGE_URL": call.storage_url}
    if os.environ.get("MA_MODEL_REGISTRY_URL"):
        shared["MA_MODEL_REGISTRY_URL"] = os.environ["MA_MODEL_REGISTRY_URL"]
    runtime_env["env_vars"] = {"PYTHONUNBUFFERED": "1", **shared,
                               **runtime_env.get("env_vars", {})}
    entrypoint = " ".join([
        os.environ.get(ENV_JOB_PYTHON, "python"), "-m",
        "michelangelo.uniflow.plugins.ray._remote._entry",
        "--storage-url", shlex.quote(call.storage_url),
        "--call", shlex.quote(call.spec_path),
        "--source", shlex.quote(source.replace(os.sep, "/")),
    ])
    submission_id = f"uniflow-{call.run_id}-{call.call_id}-{call.attempt}-{uuid.uuid4().hex[:6]}"
    deadline = None
    if call.timeout:
        deadline = call.timeout + float(os.environ.get(ENV_START_GRACE, "120"))
    run.info(f"task {call.call_id} attempt {call.attempt}: Ray job {submission_id}")
    submitted = time.time()

    def started() -> None:
        record_holding(config, "Ray job", "job start", time.time() - submitted)

    status, message = cluster.run_job(
        entrypoint=entrypoint, runtime_env=runtime_env, submission_id=submission_id,
        deadline_s=deadline, echo=_echo, setup_gate=state.setup_gate(cluster),
        on_started=started,
    )
    if state.provisioned is not None and status == "SUCCEEDED":
        _publish_deployments(state, config, run, call)
    if status != "SUCCEEDED" and not run.storage.exists(call.result_path):
        raise JobFailedError(
            f"Ray job {submission_id} on {cluster.address} ended {status} before task "
            f"{call.task_name!r} recorded a result: {message.strip() or 'no message'}. Its "
            f"output ends with:\n{cluster.logs_tail(submission_id)}"
        )


def _publish_deployments(state: _RemoteState, config: RayTask, run: Run,
                         call: RemoteCall) -> None:
    """With a run provisioner (KubeRay), what the attempt deployed outlives the run."""
    from michelangelo.uniflow.core.plugin import read_remote_artifacts

    assert state.provisioned is not None
    deployments = [a for a in read_remote_artifacts(run.storage, call)
                   if a.get("kind") == "deployment" and isinstance(a.get("_description"), dict)]
    if not deployments:
        return
    try:
        state.provisioned.publish(deployments, config, call.call_id, state.packed)
    except Exception as exc:
        # The task's own work is done; redoing it cannot fix the rollout.
        exc.uniflow_retryable = False  # type: ignore[attr-defined]
        raise


def _echo(text: str) -> None:
    # Through sys.stdout: uniflow's capture copies it into the attempt's log as well.
    sys.stdout.write(text)
    sys.stdout.flush()
