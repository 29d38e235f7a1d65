"""RayTask bodies on a real multi-node local Ray cluster (slow: starts real clusters)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import ray
import ray.data
from ray.train import ScalingConfig
from ray.train.torch import TorchTrainer

import michelangelo.uniflow.core as uniflow
from michelangelo.uniflow.core._console import Reporter
from michelangelo.uniflow.plugins.ray import CapacityError, RayTask, ResourcesUnavailableError
from michelangelo.workflow.variables import DatasetVariable

from ._cluster_probe import cluster_sessions, survivors

SHAPE = RayTask(head_cpu=1, head_memory="2Gi", worker_cpu=2, worker_memory="1Gi",
                worker_instances=2)


def _node_of_worker(config):
    import ray.train

    print(f"hello from train worker {ray.train.get_context().get_world_rank()}")
    ray.train.report({"node": ray.get_runtime_context().get_node_id()})
    return os.environ.get("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER")


@uniflow.task(config=SHAPE)
def train_on_cluster() -> dict:
    out: dict = {"sessions": cluster_sessions()}
    # Ray Train workers land on two different declared worker nodes.
    trainer = TorchTrainer(_node_of_worker, scaling_config=ScalingConfig(
        num_workers=2, resources_per_worker={"CPU": 2}))
    out["preemption_watcher"] = trainer.fit().return_value
    nodes = [n for n in ray.nodes() if n["Alive"]]
    out["nodes"] = sorted(n["Resources"].get("CPU", 0) for n in nodes)
    out["memory"] = sorted(n["Resources"].get("memory", 0) for n in nodes)
    errors = {}
    for name, scaling in {
        "guide": ScalingConfig(num_workers=8, resources_per_worker={"CPU": 4}),
        "per_node": ScalingConfig(num_workers=1, resources_per_worker={"CPU": 3}),
        "gpu": ScalingConfig(num_workers=1, use_gpu=True),
    }.items():
        try:
            TorchTrainer(_node_of_worker, scaling_config=scaling).fit()
        except CapacityError as exc:
            errors[name] = str(exc)
    out["errors"] = errors
    # Declared but busy: an actor holds one worker node's CPUs, so two 2-CPU workers
    # cannot both start; the wait is bounded and ends in a clear error.
    hog = ray.remote(num_cpus=2)(type("Hog", (), {"ping": lambda self: 1})).remote()
    ray.get(hog.ping.remote())
    os.environ["UF_RAY_RESOURCE_WAIT_S"] = "3"
    try:
        TorchTrainer(_node_of_worker, scaling_config=ScalingConfig(
            num_workers=2, resources_per_worker={"CPU": 2})).fit()
    except ResourcesUnavailableError as exc:
        out["busy"] = str(exc)
    finally:
        del os.environ["UF_RAY_RESOURCE_WAIT_S"]
        ray.kill(hog)
    out["address"] = ray.get_runtime_context().gcs_address
    return out


@uniflow.task(config=RayTask(head_cpu=1, worker_cpu=1, worker_instances=1))
def make_data(n: int) -> ray.data.Dataset:
    return ray.data.range(n).map(lambda r: {"id": r["id"], "x": float(r["id"])})


@uniflow.task(config=RayTask(head_cpu=1, worker_cpu=1, worker_instances=1))
def consume(ds: ray.data.Dataset, handle: DatasetVariable) -> dict:
    import pickle

    out = {
        "rows": ds.count(),
        "sum": float(handle.load_pandas_dataframe()["x"].sum()),
        "handle_bytes": len(pickle.dumps(handle)),
        "address": ray.get_runtime_context().gcs_address,
        "usage_stats": os.environ.get("RAY_USAGE_STATS_ENABLED"),
    }
    try:  # Ray Data's usage collection actor, which it starts when usage stats are on
        ray.get_actor("DataUsageCollectionActor", namespace="DataUsageCollectionActor")
        out["usage_actor"] = True
    except ValueError:
        out["usage_actor"] = False
    return out


@uniflow.workflow()
def cluster_workflow(n: int) -> dict:
    first = train_on_cluster()
    data = make_data(n)
    second = consume(data, data)
    return {"first": first, "second": second, "data": data}


@pytest.fixture(scope="module")
def cluster_run(tmp_path_factory):
    os.environ["UF_STORAGE_URL"] = str(tmp_path_factory.mktemp("uf"))
    # As on a user's machine, where Ray's usage stats are on unless switched off (the suite's
    # conftest switches them off).
    usage_stats = os.environ.pop("RAY_USAGE_STATS_ENABLED", None)
    ctx = uniflow.Context(reporter=Reporter())
    try:
        result = ctx.run(cluster_workflow, 2000)
        result["run_id"] = ctx.last_run_id
        result["storage"] = os.environ["UF_STORAGE_URL"]
        result["usage_stats_after"] = os.environ.get("RAY_USAGE_STATS_ENABLED")
        yield result
    finally:
        os.environ.pop("UF_STORAGE_URL", None)
        if usage_stats is not None:
            os.environ["RAY_USAGE_STATS_ENABLED"] = usage_stats


def test_train_workers_run_on_the_declared_nodes(cluster_run):
    first = cluster_run["first"]
    assert first["nodes"] == [1.0, 2.0, 2.0]
    assert first["memory"][:2] == [2**30, 2**30]


def test_ray_train_is_told_a_local_cluster_is_not_preempted(cluster_run):
    # Ray Train's controller and workers read this switch from the environment the nodes give
    # them: off, Ray Train starts no preemption watcher actor beside each training.
    assert cluster_run["first"]["preemption_watcher"] == "0"


def test_the_driver_follows_the_nodes_usage_stats_setting_while_connected(cluster_run):
    # The nodes start with usage stats off; while the run is connected the driver has them
    # off too, so a Ray Data run in a task starts no usage collection actor. After the run
    # the driver's environment is as it was.
    assert cluster_run["second"]["usage_stats"] == "0"
    assert cluster_run["second"]["usage_actor"] is False
    assert cluster_run["usage_stats_after"] is None


def test_ray_worker_output_is_kept_with_the_task(cluster_run):
    from michelangelo.uniflow.core._records import RunStore
    from michelangelo.uniflow.core._storage import Storage

    store = RunStore(Storage(cluster_run["storage"]))
    folder = os.path.join(store.call_dir(cluster_run["run_id"], "001-train_on_cluster"), "logs")
    text = ""
    for root, _, files in os.walk(folder):
        for name in files:
            with open(os.path.join(root, name), errors="replace") as handle:
                text += handle.read()
    assert "Requesting resources" in text  # Ray Train's controller, via the driver
    assert "hello from train worker 0" in text and "hello from train worker 1" in text


def test_oversized_scaling_configs_fail_before_dispatch(cluster_run):
    errors = cluster_run["first"]["errors"]
    assert "can place only" in errors["guide"]
    assert "cannot span nodes" in errors["per_node"]
    assert "declares no GPU" in errors["gpu"]


def test_busy_resources_end_in_a_bounded_clear_error(cluster_run):
    assert "after waiting 3s" in cluster_run["first"]["busy"]


def test_datasets_travel_as_small_handles_and_the_cluster_is_reused(cluster_run):
    second = cluster_run["second"]
    assert second["rows"] == 2000
    assert second["sum"] == float(sum(range(2000)))
    assert second["handle_bytes"] < 4096
    assert second["address"] == cluster_run["first"]["address"]
    data = cluster_run["data"]
    assert isinstance(data, DatasetVariable) and data.num_rows == 2000 and data.fingerprint


def test_no_ray_process_survives_the_run(cluster_run):
    assert not ray.is_initialized()
    assert survivors(cluster_run["first"]["sessions"]) == []


def test_missing_dataset_files_fail_naming_the_path(cluster_run):
    import shutil

    data = cluster_run["data"]
    shutil.rmtree(data.path)
    with pytest.raises(FileNotFoundError, match=data.path):
        data.load_pandas_dataframe()


def test_cluster_is_removed_when_the_task_raises():
    @uniflow.task(config=RayTask(head_cpu=1))
    def broken() -> None:
        sessions.extend(cluster_sessions())
        raise KeyError("bad column")

    sessions: list[int] = []
    with pytest.raises(KeyError, match="bad column"):
        uniflow.Context(reporter=Reporter()).run(broken)
    assert sessions and survivors(sessions) == []
    assert not ray.is_initialized()


SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    import michelangelo.uniflow.core as uniflow
    from michelangelo.uniflow.plugins.ray import RayTask
    sys.path.insert(0, {probe_dir!r})
    from _cluster_probe import cluster_sessions

    @uniflow.task(config=RayTask(head_cpu=1, worker_cpu=1, worker_instances=1))
    def forever():
        import os
        with open({marker!r} + ".tmp", "w") as f:
            json.dump(cluster_sessions(), f)
        os.replace({marker!r} + ".tmp", {marker!r})
        time.sleep(600)

    if __name__ == "__main__":
        uniflow.create_context().run(forever)
    """
)


def test_ctrl_c_removes_the_cluster(tmp_path):
    marker = tmp_path / "sessions.json"
    script = tmp_path / "wf.py"
    script.write_text(SCRIPT.format(probe_dir=os.path.dirname(__file__), marker=str(marker)))
    proc = subprocess.Popen([sys.executable, str(script)], env=dict(os.environ),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 240
    while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
    assert marker.exists(), proc.stderr.read().decode()[-3000:] if proc.poll() else "no start"
    time.sleep(0.5)
    import json

    sessions = json.loads(marker.read_text())
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=120)
    assert proc.returncode != 0
    assert survivors(sessions) == []


def test_ray_address_borrows_a_cluster_after_checking_it(monkeypatch):
    ray.init(address="local", num_cpus=2, include_dashboard=False,
             object_store_memory=100 * 2**20)
    try:
        monkeypatch.setenv("RAY_ADDRESS", ray.get_runtime_context().gcs_address)

        @uniflow.task(config=RayTask(head_cpu=1))
        def small() -> float:
            return ray.cluster_resources()["CPU"]

        @uniflow.task(config=RayTask(head_cpu=1, worker_cpu=8, worker_instances=1))
        def big() -> None:
            raise AssertionError("must not run")

        assert uniflow.Context(reporter=Reporter()).run(small) == 2.0
        assert ray.is_initialized()  # borrowed, not shut down
        with pytest.raises(CapacityError, match="RAY_ADDRESS"):
            uniflow.Context(reporter=Reporter()).run(big)
    finally:
        ray.shutdown()


def test_a_head_that_times_out_registering_is_started_again(tmp_path):
    """Ray gives a node 30 s to register and exits after that (a busy machine can take
    longer): the cluster starts its head again instead of failing the run."""
    from michelangelo.uniflow.plugins.ray import LocalRayCluster

    real = os.path.join(os.path.dirname(sys.executable), "ray")
    tries = tmp_path / "tries"
    ray_double = tmp_path / "ray-that-times-out-once"
    # A stand-in for `ray` that fails its first start the way Ray does, then is Ray.
    ray_double.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        echo start >> "{tries}"
        if [ "$(wc -l < "{tries}")" -eq 1 ]; then
            echo "Exception: The current node timed out during startup. This could happen" \\
                 "because some of the raylet failed to startup or the GCS has become overloaded."
            exit 1
        fi
        exec "{real}" "$@"
        """))
    ray_double.chmod(0o755)

    class Patient(LocalRayCluster):
        ray_command = str(ray_double)

    cluster = Patient(RayTask(head_cpu=1, head_memory="1Gi", worker_instances=0),
                      str(tmp_path / "logs"))
    try:
        cluster.start()
        assert ray.is_initialized() and ray.cluster_resources().get("CPU") == 1
    finally:
        cluster.shutdown()
    assert tries.read_text().count("start") == 2
    assert not ray.is_initialized()


def test_a_worker_that_times_out_registering_is_started_again(tmp_path):
    """The same 30 s limit applies to a worker node joining a busy head (a CI run under load
    lost a run to it): that worker is started again and the cluster reaches its shape."""
    from michelangelo.uniflow.plugins.ray import LocalRayCluster

    real = os.path.join(os.path.dirname(sys.executable), "ray")
    tries = tmp_path / "worker-starts"
    ray_double = tmp_path / "ray-whose-first-worker-times-out"
    # A stand-in for `ray`: the first worker start fails the way Ray does; all else is Ray.
    ray_double.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        case " $* " in
            *" --head "*) exec "{real}" "$@" ;;
        esac
        echo start >> "{tries}"
        if [ "$(wc -l < "{tries}")" -eq 1 ]; then
            sleep 2
            echo "Exception: The current node timed out during startup. This could happen" \\
                 "because some of the raylet failed to startup or the GCS has become overloaded."
            exit 1
        fi
        exec "{real}" "$@"
        """))
    ray_double.chmod(0o755)

    class Patient(LocalRayCluster):
        ray_command = str(ray_double)

    cluster = Patient(RayTask(head_cpu=1, head_memory="1Gi", worker_cpu=1, worker_memory="1Gi",
                              worker_instances=1), str(tmp_path / "logs"))
    try:
        cluster.start()
        cluster.wait_for_nodes(180)
        assert ray.cluster_resources().get("CPU") == 2
        assert len(cluster.node_pids) == 2
    finally:
        cluster.shutdown()
    assert tries.read_text().count("start") == 2
    assert not ray.is_initialized()


def _alive_nodes(config):
    return sum(1 for node in ray.nodes() if node["Alive"])


def test_a_fit_that_fits_does_not_wait_for_nodes_still_joining(tmp_path, monkeypatch):
    """Worker nodes join in the background; a Ray Train fit whose workers can already be
    placed starts without waiting for the rest (here a worker node that takes minutes)."""
    from michelangelo.uniflow.plugins.ray import LocalRayCluster

    real = os.path.join(os.path.dirname(sys.executable), "ray")
    ray_double = tmp_path / "ray-with-a-slow-worker-node"
    # A stand-in for `ray`: the head is Ray; a worker node waits 10 minutes, then is Ray.
    ray_double.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        case " $* " in
            *" --head "*) exec "{real}" "$@" ;;
        esac
        sleep 600
        exec "{real}" "$@"
        """))
    ray_double.chmod(0o755)
    monkeypatch.setattr(LocalRayCluster, "ray_command", str(ray_double))

    @uniflow.task(config=RayTask(head_cpu=1, head_memory="1Gi", worker_cpu=1,
                                 worker_memory="1Gi", worker_instances=1))
    def fit_on_the_head() -> int:
        trainer = TorchTrainer(_alive_nodes, scaling_config=ScalingConfig(
            num_workers=1, resources_per_worker={"CPU": 1}))
        return trainer.fit().return_value

    assert uniflow.Context(reporter=Reporter()).run(fit_on_the_head) == 1
    assert not ray.is_initialized()
