"""``ray_cluster_manifest``: every RayTask field reaches the RayCluster, which the CRD accepts."""

from __future__ import annotations

import copy
import json
import shlex

import pytest
import ray

from michelangelo.uniflow.plugins.ray import RayTask
from michelangelo.uniflow.plugins.ray._clusters._local import node_arguments
from michelangelo.uniflow.plugins.ray.kuberay import ray_cluster_manifest
from michelangelo.uniflow.plugins.ray.kuberay._manifest import HEAD_PORTS
from tests.uniflow.plugins.ray.kuberay._crd_schema import problems
from tests.uniflow.plugins.ray.kuberay._kuberay_rules import (
    head_service_ports,
    resources_map,
    service_port_problems,
)

# A matrix that exercises every field: GPUs, disk and object store included (the fields
# Michelangelo's own RayTask drops on the way to the cluster), fractional CPUs, no memory.
TASKS = {
    "cpu-only": RayTask(head_cpu=2, head_memory="8Gi", worker_cpu=4, worker_memory="16Gi",
                        worker_instances=4),
    "gpu-disk-store": RayTask(head_cpu=1, head_memory="4Gi", head_gpu=0, head_disk="20Gi",
                              head_object_store_memory="1Gi", worker_cpu=8,
                              worker_memory="64Gi", worker_gpu=2, worker_disk="100Gi",
                              worker_object_store_memory="8Gi", worker_instances=2),
    "head-gpu-fractional": RayTask(head_cpu="500m", head_gpu=1, head_memory="2Gi",
                                   worker_instances=0),
    "no-memory": RayTask(head_cpu=1, worker_cpu=2, worker_instances=1),
    "runtime-env": RayTask(head_cpu=1, worker_cpu=1, worker_instances=1,
                           runtime_env={"env_vars": {"MODE": "fast"}, "pip": ["einops"]}),
}


def _render(task: RayTask, **kwargs):
    return ray_cluster_manifest(task, name="uf-run-train", labels={
        "uniflow.michelangelo.ai/run-id": "20261129-101010-abcdef",
        "uniflow.michelangelo.ai/task": "train"}, now=1_000_000.0, **kwargs)


def _flags_as_params(flags: list[str]) -> dict[str, str]:
    return dict(flag[2:].split("=", 1) for flag in flags)


def _group(manifest, role):
    spec = manifest["spec"]
    return spec["headGroupSpec"] if role == "head" else spec["workerGroupSpecs"][0]


@pytest.mark.parametrize("label", sorted(TASKS))
def test_manifest_is_valid_against_the_kuberay_crd(label):
    assert problems(_render(TASKS[label], storage_secret="uf-storage")) == []


@pytest.mark.parametrize("label", sorted(TASKS))
def test_no_field_is_dropped(label):
    task = TASKS[label]
    manifest = _render(task)
    roles = ["head"] + (["worker"] if task.worker_instances else [])
    assert len(manifest["spec"]["workerGroupSpecs"]) == (1 if task.worker_instances else 0)
    for role in roles:
        group = _group(manifest, role)
        container = group["template"]["spec"]["containers"][0]
        requests, limits = container["resources"]["requests"], container["resources"]["limits"]
        assert requests == limits
        params = group["rayStartParams"]
        assert float(params["num-cpus"]) >= task.parsed(f"{role}_cpu")
        cpu = requests["cpu"]
        cpus = int(cpu[:-1]) / 1000 if cpu.endswith("m") else int(cpu)
        assert cpus == task.parsed(f"{role}_cpu")
        gpus = task.parsed(f"{role}_gpu")
        assert params["num-gpus"] == str(gpus)
        assert requests.get("nvidia.com/gpu") == (str(gpus) if gpus else None)
        memory = task.parsed(f"{role}_memory")
        assert requests.get("memory") == (str(memory) if memory is not None else None)
        assert params.get("memory") == (str(memory) if memory is not None else None)
        disk = task.parsed(f"{role}_disk")
        assert requests.get("ephemeral-storage") == (str(disk) if disk is not None else None)
        if disk is not None:
            assert resources_map(params) == {"disk": float(disk)}
        store = task.parsed(f"{role}_object_store_memory")
        if store is not None:
            assert params["object-store-memory"] == str(store)
    if task.worker_instances:
        worker = _group(manifest, "worker")
        assert worker["replicas"] == worker["minReplicas"] == worker["maxReplicas"] \
            == task.worker_instances
    if task.runtime_env:
        annotations = manifest["metadata"]["annotations"]
        assert json.loads(annotations["uniflow.michelangelo.ai/runtime-env"]) == task.runtime_env
        env = _group(manifest, "head")["template"]["spec"]["containers"][0]["env"]
        assert {"name": "MODE", "value": "fast"} in env


@pytest.mark.parametrize("label", sorted(TASKS))
def test_local_flags_and_manifest_advertise_the_same_resources(label):
    task = TASKS[label]
    manifest = _render(task)
    for role in ["head"] + (["worker"] if task.worker_instances else []):
        params = dict(_group(manifest, role)["rayStartParams"])
        params.pop("dashboard-host", None)
        if "resources" in params:
            params["resources"] = shlex.split(params["resources"])[0]  # as the shell reads it
        assert params == _flags_as_params(node_arguments(task, role))


def test_metadata_ties_the_cluster_to_its_run():
    manifest = _render(TASKS["cpu-only"], storage_secret="uf-storage")
    labels = manifest["metadata"]["labels"]
    assert labels["uniflow.michelangelo.ai/run-id"] == "20261129-101010-abcdef"
    assert labels["uniflow.michelangelo.ai/task"] == "train"
    assert labels["uniflow.michelangelo.ai/managed-by"] == "uniflow"
    assert manifest["metadata"]["annotations"]["uniflow.michelangelo.ai/expires-at"] == str(
        1_000_000 + 24 * 3600)
    assert manifest["spec"]["rayVersion"] == ray.__version__
    for role in ("head", "worker"):
        template = _group(manifest, role)["template"]
        assert template["metadata"]["labels"] == labels
        container = template["spec"]["containers"][0]
        assert container["envFrom"] == [{"secretRef": {"name": "uf-storage"}}]
        assert container["image"].startswith(f"rayproject/ray:{ray.__version__}-py3")


def test_the_schema_check_catches_bad_types_and_unknown_fields():
    manifest = _render(TASKS["cpu-only"])
    wrong_type = copy.deepcopy(manifest)
    wrong_type["spec"]["workerGroupSpecs"][0]["replicas"] = "four"
    assert any("replicas" in p for p in problems(wrong_type))
    unknown = copy.deepcopy(manifest)
    unknown["spec"]["headGroupSpec"]["rayStartParam"] = {"num-cpus": "1"}
    assert any("rayStartParam:" in p for p in problems(unknown))
    missing = copy.deepcopy(manifest)
    del missing["spec"]["headGroupSpec"]["template"]
    assert any("template" in p for p in problems(missing))


@pytest.mark.parametrize("kwargs, field", [
    ({"name": "Train_Run"}, "name='Train_Run'"),
    ({"name": "x" * 51}, "name="),
    ({"name": "ok", "namespace": "-bad"}, "namespace='-bad'"),
    ({"name": "ok", "labels": {"a/b": "not valid!"}}, "labels['a/b']"),
])
def test_bad_names_are_refused_with_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field.replace("[", r"\[").replace("(", r"\(")):
        ray_cluster_manifest(TASKS["no-memory"], **kwargs)


def test_ray_service_renders_the_serving_description_and_validates():
    import yaml

    from michelangelo.lib.serving._description import DeploymentDescription
    from michelangelo.uniflow.plugins.ray.kuberay import ray_service_manifest

    description = DeploymentDescription(
        name="churn", project_name="demo", model_name="churn", revision_id=3,
        weights_sha256="ab" * 32, registry_url="s3://models/registry", num_replicas=2)
    manifest = ray_service_manifest(description.to_serve_config(), TASKS["cpu-only"],
                                    name="churn-serve", storage_secret="uf-storage")
    assert problems(manifest) == []
    config = yaml.safe_load(manifest["spec"]["serveConfigV2"])
    app = config["applications"][0]
    assert app["import_path"] == "michelangelo.lib.serving._app:build_app"
    assert DeploymentDescription.from_dict(app["args"]["description"]) == description
    assert config["http_options"] == {"host": "0.0.0.0", "port": 8000}
    # KubeRay probes each worker's own Serve proxy for readiness: a proxy where replicas run
    assert config["proxy_location"] == "EveryNode"
    cluster = manifest["spec"]["rayClusterConfig"]
    assert cluster["workerGroupSpecs"][0]["replicas"] == 4
    # a lasting endpoint: no expiry, and not one of the run clusters `clusters gc` removes
    assert manifest["metadata"]["labels"]["uniflow.michelangelo.ai/managed-by"] == \
        "uniflow-serving"
    assert "annotations" not in manifest["metadata"]

    sandboxed = ray_service_manifest(description.to_serve_config(), TASKS["cpu-only"],
                                     name="churn-serve", working_dir="s3://b/project.zip",
                                     serve_node_port=30800)
    assert problems(sandboxed) == []
    app = yaml.safe_load(sandboxed["spec"]["serveConfigV2"])["applications"][0]
    assert app["runtime_env"] == {"working_dir": "s3://b/project.zip"}
    assert sandboxed["spec"]["serveService"]["spec"]["ports"][0]["nodePort"] == 30800


def test_head_node_ports_for_a_host_mapped_sandbox():
    manifest = _render(TASKS["no-memory"], head_node_ports={"dashboard": 30265, "serve": 30800})
    assert problems(manifest) == []
    head = manifest["spec"]["headGroupSpec"]
    assert head["serviceType"] == "NodePort"
    assert head["headService"]["spec"]["ports"] == [
        {"name": "dashboard", "port": 8265, "nodePort": 30265},
        {"name": "serve", "port": 8000, "nodePort": 30800}]
    with pytest.raises(ValueError, match="head ports are"):
        _render(TASKS["no-memory"], head_node_ports={"dashbord": 30265})


@pytest.mark.parametrize("label", sorted(TASKS))
def test_resources_reach_kuberay_and_the_shell_as_the_same_json(label):
    """KubeRay parses ``rayStartParams.resources`` itself (``getResourcesMap`` in
    ``controllers/ray/common/pod.go``, imitated by ``resources_map``) and pastes it into the
    pod's bash command line; both must read the one JSON map ``ray start`` gets locally."""
    task = TASKS[label]
    for role in ["head"] + (["worker"] if task.worker_instances else []):
        params = _group(_render(task), role)["rayStartParams"]
        local = _flags_as_params(node_arguments(task, role)).get("resources")
        assert resources_map(params) == {k: float(v) for k, v in
                                         json.loads(local or "{}").items()}
        if local is not None:
            assert shlex.split(f"--resources={params['resources']}") == [f"--resources={local}"]


@pytest.mark.parametrize("node_ports", [
    {}, {"dashboard": 30265}, {"dashboard": 30265, "serve": 30800},
    {"gcs": 30379, "dashboard": 30265, "client": 30001, "serve": 30800}])
def test_the_head_service_kuberay_builds_has_unique_ports(node_ports):
    """KubeRay appends the ports it derives from the head container to a custom
    ``headService`` without removing duplicates (``BuildServiceForHeadPod`` in
    ``controllers/ray/common/service.go``, imitated by ``head_service_ports``); the API server
    refuses a Service with two ports of one name or number, and the cluster never starts."""
    manifest = _render(TASKS["no-memory"], head_node_ports=node_ports or None)
    assert problems(manifest) == []
    ports = head_service_ports(manifest)
    assert service_port_problems(ports) == []
    assert {p["port"] for p in ports} >= {6379, 8265, 10001, 8000}
    assert {(p["port"], p["nodePort"]) for p in ports if "nodePort" in p} == {
        (HEAD_PORTS[name], node_port) for name, node_port in node_ports.items()}


@pytest.mark.parametrize("name, why", [
    ("m" * 48, "48 characters long"),
    ("7-churn", "starting with a letter"),
    ("churn_model", "starting with a letter"),
])
def test_ray_service_names_kuberay_would_refuse_are_refused_here(name, why):
    """KubeRay answers ``ValidationFailed`` to a RayService name that is not a DNS-1035 label
    of at most 47 characters (``ValidateRayServiceMetadata`` in
    ``controllers/ray/utils/validation.go``, ``MaxRayServiceNameLength`` in ``constant.go``)."""
    from michelangelo.uniflow.plugins.ray.kuberay import ray_service_manifest

    with pytest.raises(ValueError, match=rf"deployment name='{name}' is not a valid RayService "
                                         rf"name.*{why}.*Fix: use a name such as 'churn-model'"):
        ray_service_manifest({"applications": []}, TASKS["no-memory"], name=name)
    assert problems(ray_service_manifest({"applications": []}, TASKS["no-memory"],
                                         name="m" * 47)) == []


def test_ray_cluster_names_must_start_with_a_letter():
    """``ValidateRayClusterMetadata`` (``controllers/ray/utils/validation.go``): DNS-1035."""
    with pytest.raises(ValueError, match="name='1-train' is not a valid RayCluster name"):
        ray_cluster_manifest(TASKS["no-memory"], name="1-train")


def test_token_auth_asks_kuberay_for_a_token_and_bad_modes_are_refused():
    from michelangelo.uniflow.core.errors import UserError
    from michelangelo.uniflow.plugins.ray.kuberay._provisioner import KubeRaySettings

    plain = ray_cluster_manifest(TASKS["cpu-only"], name="plain")
    assert "authOptions" not in plain["spec"]  # KubeRay's own default: no authentication
    token = ray_cluster_manifest(TASKS["cpu-only"], name="guarded", auth="token")
    assert token["spec"]["authOptions"] == {"mode": "token"}
    assert problems(token) == []
    with pytest.raises(ValueError, match=r"auth='tokens' is not one of disabled, token"):
        ray_cluster_manifest(TASKS["cpu-only"], name="typo", auth="tokens")
    with pytest.raises(UserError, match=r"--auth 'on' is not one of disabled, token. Fix"):
        KubeRaySettings(auth="on")
    from michelangelo.uniflow.plugins.ray.kuberay import ray_service_manifest

    service = ray_service_manifest({"applications": []}, TASKS["cpu-only"], name="guarded",
                                   auth="token")
    assert service["spec"]["rayClusterConfig"]["authOptions"] == {"mode": "token"}


def _wait_for_head(manifest):
    workers = manifest["spec"]["workerGroupSpecs"]
    assert "initContainers" not in manifest["spec"]["headGroupSpec"]["template"]["spec"]
    (group,) = workers
    inits = group["template"]["spec"]["initContainers"]
    assert [c["name"] for c in inits] == ["uf-wait-for-head"]  # KubeRay appends its own
    return inits[0]


def test_worker_pods_wait_for_the_head_with_short_checks_first():
    """Before KubeRay's ``wait-gcs-ready`` (whose first check of a GCS still starting takes
    about 40 s), each worker pod checks the head's GCS every second with 1 s timeouts."""
    from michelangelo.uniflow.plugins.ray.kuberay import ray_service_manifest

    manifest = ray_cluster_manifest(TASKS["cpu-only"], name="plain", image="ray:x")
    wait = _wait_for_head(manifest)
    assert wait["image"] == "ray:x"
    env = {e["name"]: e for e in wait["env"]}
    assert env["RAY_gcs_rpc_server_connect_timeout_s"]["value"] == "1"
    assert env["RAY_py_gcs_connect_timeout_s"]["value"] == "1"
    assert "RAY_AUTH_TOKEN" not in env
    assert 'ray health-check --address "$address"' in wait["args"][0]
    assert '"$FQ_RAY_IP:6379"' in wait["args"][0]
    # The pod's effective requests stay what KubeRay's own init container makes them.
    assert wait["resources"]["requests"] == {"cpu": "200m", "memory": "256Mi"}
    assert problems(manifest) == []
    # Token mode: the token from the Secret KubeRay makes, named like the cluster.
    token = _wait_for_head(ray_cluster_manifest(TASKS["cpu-only"], name="guarded",
                                                auth="token"))
    env = {e["name"]: e for e in token["env"]}
    assert env["RAY_AUTH_MODE"]["value"] == "token"
    assert env["RAY_AUTH_TOKEN"]["valueFrom"] == {
        "secretKeyRef": {"name": "guarded", "key": "auth_token"}}
    assert "initContainers" not in _render(TASKS["head-gpu-fractional"])["spec"][
        "headGroupSpec"]["template"]["spec"]  # no workers, nothing to wait
    # Like KubeRay's own, it gets the Ray container's env (the task's env_vars), ours last.
    wait = _wait_for_head(_render(TASKS["runtime-env"]))
    assert [e["name"] for e in wait["env"]] == [
        "MODE", "RAY_gcs_rpc_server_connect_timeout_s", "RAY_py_gcs_connect_timeout_s"]
    # A RayService's cluster gets a name KubeRay makes up, so in token mode its Secret is
    # unknown here: those workers keep KubeRay's wait alone.
    served = ray_service_manifest({"applications": []}, TASKS["cpu-only"], name="svc")
    assert _wait_for_head({"spec": served["spec"]["rayClusterConfig"]})
    guarded = ray_service_manifest({"applications": []}, TASKS["cpu-only"], name="svc",
                                   auth="token")
    (group,) = guarded["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    assert "initContainers" not in group["template"]["spec"]


@pytest.mark.parametrize(("fq_ray_ip", "fails", "said"), [
    ("uf-x-head-svc.default.svc.cluster.local", 2, "answered after"),
    ("", 0, None),  # no address from KubeRay: nothing to wait for here
])
def test_the_wait_script_runs_until_the_check_passes(tmp_path, fq_ray_ip, fails, said):
    import os
    import subprocess

    wait = _wait_for_head(ray_cluster_manifest(TASKS["cpu-only"], name="uf-x"))
    calls = tmp_path / "calls"
    fake = tmp_path / "ray"  # fails `fails` times, then answers
    fake.write_text(f"#!/bin/bash\necho \"$@\" >> {calls}\n"
                    f"[ $(wc -l < {calls}) -gt {fails} ]\n")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", "FQ_RAY_IP": fq_ray_ip}
    done = subprocess.run([*wait["command"], *wait["args"]], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    if said is None:
        assert not calls.exists() and done.stdout == ""
        return
    lines = calls.read_text().splitlines()
    assert lines == [f"health-check --address {fq_ray_ip}:6379"] * (fails + 1)
    assert said in done.stdout


def test_the_wait_script_ends_on_sigterm_as_a_deleted_pod_sends_it(tmp_path):
    """As PID 1, a shell without a handler ignores SIGTERM and the pod takes its whole grace
    period to go; the script has one, and ends after the check under way."""
    import os
    import signal
    import subprocess
    import time

    wait = _wait_for_head(ray_cluster_manifest(TASKS["cpu-only"], name="uf-x"))
    fake = tmp_path / "ray"  # a head that never answers
    fake.write_text("#!/bin/bash\nexit 1\n")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}",
           "FQ_RAY_IP": "uf-x-head-svc.default.svc.cluster.local"}
    proc = subprocess.Popen([*wait["command"], *wait["args"]], env=env,
                            stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(1.5)
        assert proc.poll() is None  # still waiting for the head
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 143
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_nodes_count_as_ready_soon_after_their_ray_is_up():
    """KubeRay's own readiness probe (the node's ``/api/healthz``) first asks after 10 s; the
    manifest gives the same probe asked after 1 s and every second. A RayService's workers
    get KubeRay's check of their Serve proxy too."""
    from michelangelo.uniflow.plugins.ray.kuberay import ray_service_manifest
    from michelangelo.uniflow.plugins.ray.kuberay._manifest import _readiness_probe

    manifest = ray_cluster_manifest(TASKS["cpu-only"], name="plain")
    for role in ("head", "worker"):
        probe = _group(manifest, role)["template"]["spec"]["containers"][0]["readinessProbe"]
        assert probe["httpGet"] == {"path": "/api/healthz", "port": 52365}
        assert probe["initialDelaySeconds"] == 1 and probe["periodSeconds"] == 1
        assert probe["periodSeconds"] * probe["failureThreshold"] == 5 * 10  # KubeRay's window
    assert problems(manifest) == []
    served = ray_service_manifest({"applications": []}, TASKS["cpu-only"], name="svc")
    config = served["spec"]["rayClusterConfig"]
    head = config["headGroupSpec"]["template"]["spec"]["containers"][0]["readinessProbe"]
    assert head["httpGet"]["path"] == "/api/healthz"
    # A RayService's workers: the node and its Serve proxy, as KubeRay probes them, sooner.
    (group,) = config["workerGroupSpecs"]
    probe = group["template"]["spec"]["containers"][0]["readinessProbe"]
    check = probe["exec"]["command"][-1]
    assert check.index("http://localhost:52365/api/healthz") < check.index(" && ") < check.index(
        "http://localhost:8000/-/healthz")
    assert probe["failureThreshold"] == 1 and probe["initialDelaySeconds"] == 1
    assert problems(served | {"kind": "RayCluster", "spec": config}) == []
    # Before Ray 2.53 nodes have no such endpoint, and KubeRay probes them its own way.
    assert _readiness_probe("2.52.1") is None and _readiness_probe("2.53.0") is not None
    assert _readiness_probe("3.0.0.dev0") is not None


def test_a_cpu_request_fraction_lowers_only_the_cpu_request():
    task = RayTask(head_cpu=1, head_memory="2Gi", worker_cpu=2, worker_memory="2Gi",
                   worker_instances=2)
    manifest = ray_cluster_manifest(task, name="uf-frac", cpu_request_fraction=0.1)
    assert not problems(manifest)
    head = manifest["spec"]["headGroupSpec"]
    worker = manifest["spec"]["workerGroupSpecs"][0]
    for group, cpus, request in ((head, "1", "100m"), (worker, "2", "200m")):
        resources = group["template"]["spec"]["containers"][0]["resources"]
        assert resources["requests"] == {"cpu": request, "memory": "2147483648"}
        assert resources["limits"] == {"cpu": cpus, "memory": "2147483648"}
        # Ray still advertises the CPUs the RayTask declares
        assert group["rayStartParams"]["num-cpus"] == cpus
    with pytest.raises(ValueError, match=r"cpu_request_fraction=0 is not in \(0, 1\]"):
        ray_cluster_manifest(task, name="uf-frac", cpu_request_fraction=0)
