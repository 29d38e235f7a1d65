"""``sandbox create`` against the stand-ins: the exact commands, the manifests, idempotence."""

from __future__ import annotations

import base64
import json
import os
import re
import sys

import pytest

from michelangelo.sandbox import load_sandbox_settings
from michelangelo.sandbox._image import base_image
from tests.sandbox._tool_doubles import image_id
from tests.sandbox.conftest import make_tools

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CTX = ["--context", "kind-michelangelo"]
DOCTOR = [["docker", "--version"], ["kind", "version"],
          ["kubectl", "version", "--client", "-o", "json"], ["helm", "version", "--short"],
          ["docker", "info", "--format", "{{.ServerVersion}}"],
          ["docker", "info", "--format", "{{json .}}"]]


@pytest.fixture(scope="module")
def runs(first_create):
    """The first ``create`` and a second one on the state it left."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        tools = first_create["tools"]
        for name, value in [("PATH", tools.bin), ("MA_SANDBOX_FILE", tools.settings_path),
                            ("HOME", os.path.dirname(tools.settings_path))]:
            monkeypatch.setenv(name, value)
        tools.forget_calls()
        second = tools.invoke("create", "--project-dir", tools.project)
        with open(tools.settings_path) as handle:
            second_settings = handle.read()
        found = {"tools": tools, "first": first_create["result"],
                 "first_calls": first_create["calls"], "mode": first_create["mode"],
                 "first_settings": first_create["settings"], "second": second,
                 "second_calls": tools.calls(), "second_settings": second_settings,
                 "settings": load_sandbox_settings(tools.settings_path)}
    return found


def _argv(calls):
    return [[c["tool"], *c["argv"]] for c in calls]


CTR = ["docker", "exec", "michelangelo-control-plane", "ctr", "--namespace", "k8s.io"]
IMPORT = ["docker", "exec", "-i", "michelangelo-control-plane", "ctr", "--namespace", "k8s.io",
          "images", "import", "--all-platforms", "--digests", "--snapshotter=overlayfs", "-"]


def _load_calls(image):
    """What starting the runtime image's stream into the node runs: the IDs here and on the
    node, the node's snapshotter, then ``docker save`` and the import it feeds."""
    return [[*CTR, "images", "list"],
            ["docker", "image", "inspect", "--format", "{{.Id}}", image],
            ["docker", "exec", "michelangelo-control-plane", "containerd", "config", "dump"]]


def _split_stream(calls):
    """The stream's two sides run beside the steps that follow its start: take them out of
    the sequence, and return it with the pair."""
    stream = [c for c in calls if c[:2] == ["docker", "save"] or c[:3] == IMPORT[:3]]
    return [c for c in calls if c not in stream], stream


def test_first_run_command_sequence(runs):
    assert runs["first"].exit_code == 0, runs["first"].output
    settings = runs["settings"]
    calls, stream = _split_stream(_argv(runs["first_calls"]))
    config = calls[11][6]
    build = next(c for c in calls if c[:2] == ["docker", "build"])
    context = build[-1]
    assert calls == [
        *DOCTOR,
        ["docker", "image", "inspect", settings.image],
        ["docker", "build", "--tag", settings.image,
         "--build-arg", f"BASE_IMAGE={base_image()}",
         "--file", os.path.join(context, "Dockerfile"), context],
        ["docker", "images", "michelangelo-sandbox", "--format", "{{.Repository}}:{{.Tag}}"],
        ["kind", "get", "clusters"],
        ["docker", "info", "--format", "{{json .}}"],
        ["kind", "create", "cluster", "--name", "michelangelo", "--config", config,
         "--wait", "120s"],
        ["kind", "export", "kubeconfig", "--name", "michelangelo"],
        *_load_calls(settings.image),
        ["helm", "list", "--kube-context", "kind-michelangelo", "--namespace",
         "kuberay-system", "--output", "json"],
        ["helm", "repo", "add", "kuberay", "https://ray-project.github.io/kuberay-helm/",
         "--force-update"],
        ["helm", "upgrade", "--install", "kuberay-operator", "kuberay/kuberay-operator",
         "--version", "1.7.0", "--kube-context", "kind-michelangelo", "--namespace",
         "kuberay-system", "--create-namespace"],
        ["kubectl", *CTX, "--namespace", "kuberay-system", "rollout", "status",
         "deployment/kuberay-operator", "--timeout=300s"],
        ["kubectl", *CTX, "--namespace", "michelangelo", "get", "secret",
         "michelangelo-storage", "--output", "json", "--ignore-not-found"],
        ["kubectl", *CTX, "apply", "--filename", "-"],
        ["kubectl", *CTX, "--namespace", "michelangelo", "rollout", "status",
         "deployment/minio", "--timeout=300s"],
        ["kubectl", *CTX, "--namespace", "michelangelo", "wait", "--for=condition=complete",
         "job/minio-make-bucket", "--timeout=300s"],
        [*CTR, "images", "label", f"docker.io/library/{settings.image}",
         f"michelangelo.sandbox/docker-image-id={image_id(settings.image)}"],
        [*CTR, "images", "list"], [*CTR, "containers", "list"],
    ]
    # no archive on disk: docker save streams into the node's containerd
    assert sorted(stream) == [IMPORT, ["docker", "save", settings.image]]
    (imported,) = [c for c in runs["first_calls"] if c["argv"][:2] == ["exec", "-i"]]
    assert json.loads(imported["stdin"]) == {"archive": [settings.image]}
    assert config == os.path.join(os.path.dirname(runs["tools"].settings_path),
                                  "sandbox-kind.json")
    assert re.fullmatch(r"michelangelo-sandbox:[0-9a-f]{12}", settings.image)
    # only 'kubectl apply' was fed anything, and nothing secret is on any command line
    fed = [c for c in runs["first_calls"] if c["stdin"] and c["tool"] == "kubectl"]
    assert [c["argv"][-3:] for c in fed] == [["apply", "--filename", "-"]]
    command_lines = json.dumps(calls)
    assert settings.secret_key not in command_lines
    assert settings.access_key not in command_lines


def test_kind_config_maps_ports_to_loopback(runs):
    config = runs["first_calls"][11]["seen"]["config"]
    assert config["kind"] == "Cluster" and config["apiVersion"] == "kind.x-k8s.io/v1alpha4"
    (node,) = config["nodes"]
    assert node["role"] == "control-plane"
    mappings = {(m["hostPort"], m["containerPort"], m["listenAddress"])
                for m in node["extraPortMappings"]}
    assert mappings == {(8265, 30265, "127.0.0.1"), (8000, 30800, "127.0.0.1"),
                        (9000, 30900, "127.0.0.1"), (9001, 30901, "127.0.0.1")}
    assert runs["settings"].node_ports == {"dashboard": 30265, "serve": 30800, "s3": 30900,
                                           "s3_console": 30901}


def test_a_registry_node_unpacks_its_images_afresh(runs):
    # kindest/node's boot does not clear an earlier cluster's containers: no kept store
    (node,) = runs["first_calls"][11]["seen"]["config"]["nodes"]
    assert "extraMounts" not in node
    assert "node images kept" not in runs["first"].output


def test_kind_config_keeps_the_node_image_store_in_a_folder_given():
    from michelangelo.sandbox._kind_config import kind_config

    (node,) = kind_config(image_store="/cache/sandbox-node/containerd")["nodes"]
    assert node["extraMounts"] == [{"hostPath": "/cache/sandbox-node/containerd",
                                    "containerPath": "/var/lib/containerd"}]


def test_a_built_node_keeps_its_image_store_only_on_an_engine_of_this_machine(tmp_path,
                                                                           monkeypatch):
    import socket

    from michelangelo.sandbox._build_images import BuiltImages
    from michelangelo.sandbox._create import CreateOptions, Creator

    monkeypatch.setenv("MICHELANGELO_CACHE", str(tmp_path))
    creator = Creator(CreateOptions(build_images=True), echo=lambda _: None)
    here = {"Name": socket.gethostname()}
    assert creator._image_store(here) is None  # the registry's kindest/node: no store
    creator._built = BuiltImages.__new__(BuiltImages)
    store = creator._image_store(here)
    assert store == str(tmp_path / "sandbox-node" / "containerd") and os.path.isdir(store)
    assert creator._image_store({"Name": "docker-desktop"}) is None  # the folder is not the VM's
    assert creator._image_store({}) is None


def test_storage_manifests(runs):
    settings = runs["settings"]
    (apply,) = [c for c in runs["first_calls"] if c["stdin"] and c["tool"] == "kubectl"]
    items = json.loads(apply["stdin"])["items"]
    assert [(i["kind"], i["metadata"]["name"]) for i in items] == [
        ("Namespace", "michelangelo"), ("Secret", "michelangelo-storage"),
        ("Deployment", "minio"), ("Service", "minio"), ("Job", "minio-make-bucket")]
    namespace, secret, deployment, service, job = items
    assert all(i["metadata"]["namespace"] == "michelangelo" for i in items[1:])
    endpoint = "http://minio.michelangelo.svc.cluster.local:9000"
    assert "stringData" not in secret
    assert {k: base64.b64decode(v).decode() for k, v in secret["data"].items()} == {
        "AWS_ACCESS_KEY_ID": settings.access_key, "AWS_SECRET_ACCESS_KEY": settings.secret_key,
        "AWS_ENDPOINT_URL": endpoint, "AWS_REGION": "us-east-1",
        "FSSPEC_S3_ENDPOINT_URL": endpoint}
    assert len(settings.secret_key) >= 20 and settings.s3_endpoint_in_cluster == endpoint
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["image"].startswith("quay.io/minio/minio:RELEASE.")
    # MinIO's root user comes from the Secret, not from literal values in the manifest
    env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container["env"]}
    assert env == {"MINIO_ROOT_USER": {"name": "michelangelo-storage",
                                       "key": "AWS_ACCESS_KEY_ID"},
                   "MINIO_ROOT_PASSWORD": {"name": "michelangelo-storage",
                                           "key": "AWS_SECRET_ACCESS_KEY"}}
    assert service["spec"]["type"] == "NodePort"
    assert {(p["port"], p["nodePort"]) for p in service["spec"]["ports"]} == {
        (9000, 30900), (9001, 30901)}
    script = job["spec"]["template"]["spec"]["containers"][0]["command"][-1]
    assert "mc mb --ignore-existing sandbox/michelangelo" in script
    for item in (namespace, deployment, service, job):
        assert settings.secret_key not in json.dumps(item)


def test_image_built_from_shipped_dockerfile(runs):
    build = next(c["seen"] for c in runs["first_calls"] if c["argv"][:1] == ["build"])
    with open(os.path.join(ROOT, "michelangelo", "sandbox", "Dockerfile")) as handle:
        assert build["dockerfile"] == handle.read()
    assert "ARG BASE_IMAGE=rayproject/ray:" in build["dockerfile"]
    # just what 'pip install .' needs: no virtualenv, data or bytecode
    assert build["context_files"] == sorted([
        "Dockerfile", "README.md", "constraints.txt", "pyproject.toml",
        "michelangelo/__init__.py", "michelangelo/sandbox/Dockerfile"])
    with open(os.path.join(ROOT, "constraints.txt")) as handle:
        ray_pin = re.search(r"^ray==(\S+)$", handle.read(), re.MULTILINE).group(1)
    py = f"{sys.version_info.major}{sys.version_info.minor}"
    assert f"BASE_IMAGE=rayproject/ray:{ray_pin}-py{py}" in build["build_args"]


def test_settings_file_private_and_no_secret_in_output(runs):
    settings = runs["settings"]
    assert runs["mode"] == 0o600
    assert settings.kube_context == "kind-michelangelo"
    assert settings.namespace == "michelangelo"
    assert settings.storage_url == "s3://michelangelo/uniflow"
    assert settings.s3_endpoint == "http://127.0.0.1:9000"
    assert settings.storage_secret == "michelangelo-storage"
    assert settings.storage_options() == {
        "key": settings.access_key, "secret": settings.secret_key,
        "client_kwargs": {"endpoint_url": "http://127.0.0.1:9000"}}
    for text in (runs["first"].output, runs["second"].output, repr(settings)):
        assert settings.secret_key not in text
        assert settings.access_key not in text
    assert "[10/10] settings file" in runs["first"].output
    assert re.search(r"\[3/10\] kind cluster 'michelangelo' \.\.\.\n +created",
                     runs["first"].output)
    assert re.search(r"\[9/10\] runtime image loaded into kind \.\.\.\n +michelangelo-sandbox:"
                     r"[0-9a-f]{12} on the kind node, loaded in [0-9]+ s", runs["first"].output)


def test_second_run_changes_nothing(runs):
    assert runs["second"].exit_code == 0, runs["second"].output
    calls = _argv(runs["second_calls"])
    image = runs["settings"].image
    assert calls == [
        *DOCTOR,
        ["docker", "image", "inspect", image],
        ["kind", "get", "clusters"],
        ["docker", "inspect", "--format", "{{json .HostConfig.PortBindings}}",
         "michelangelo-control-plane"],
        ["kind", "export", "kubeconfig", "--name", "michelangelo"],
        [*CTR, "images", "list"],
        ["docker", "image", "inspect", "--format", "{{.Id}}", image],
        ["helm", "list", "--kube-context", "kind-michelangelo", "--namespace",
         "kuberay-system", "--output", "json"],
        ["kubectl", *CTX, "--namespace", "kuberay-system", "rollout", "status",
         "deployment/kuberay-operator", "--timeout=300s"],
        ["kubectl", *CTX, "--namespace", "michelangelo", "get", "secret",
         "michelangelo-storage", "--output", "json", "--ignore-not-found"],
        ["kubectl", *CTX, "apply", "--filename", "-"],
        ["kubectl", *CTX, "--namespace", "michelangelo", "rollout", "status",
         "deployment/minio", "--timeout=300s"],
        ["kubectl", *CTX, "--namespace", "michelangelo", "wait", "--for=condition=complete",
         "job/minio-make-bucket", "--timeout=300s"],
        [*CTR, "images", "list"], [*CTR, "containers", "list"],
    ]
    # the same credentials (read back from the Secret), so MinIO keeps working
    assert runs["second_settings"] == runs["first_settings"]
    output = runs["second"].output
    assert "exists, kept" in output and "installed, kept" in output
    assert "0 object(s) created or changed, credentials kept" in output
    assert f"{image} exists, kept" in output
    assert f"{image} on the node, kept" in output  # its ID is the one loaded, so no load


def test_create_stops_at_doctor_when_a_tool_is_missing(tmp_path, monkeypatch):
    tools = make_tools(tmp_path, monkeypatch, ("docker", "kind", "helm"))
    result = tools.invoke("create", "--project-dir", tools.project)
    assert result.exit_code == 1
    assert "kubectl: not found on PATH" in result.output
    assert not any(c[1] in ("create", "build") for c in tools.commands())
    assert not os.path.exists(tools.settings_path)


def test_bad_wait_is_refused_before_any_command(tools):
    result = tools.invoke("create", "--wait", "5 minutes")
    assert result.exit_code == 1
    assert "wait='5 minutes' is not a duration kubectl understands" in result.output
    assert "e.g. '300s' or '15m'" in result.output
    assert tools.commands() == []


def test_images_only_without_build_images_is_refused_before_any_command(tools):
    result = tools.invoke("create", "--images-only")
    assert result.exit_code == 1
    assert "images_only=True builds the images --build-images makes" in result.output
    assert "pass build_images=True (--build-images) with it" in result.output
    assert tools.commands() == []


def test_existing_cluster_without_port_mappings_is_refused(created):
    tools = created
    state = tools.state()
    state["node_ports"]["michelangelo"] = [m for m in state["node_ports"]["michelangelo"]
                                           if m["hostPort"] != 9000]
    tools.set_state(node_ports=state["node_ports"])
    tools.forget_calls()
    result = tools.invoke("create", "--project-dir", tools.project)
    assert result.exit_code == 1
    assert ("kind cluster 'michelangelo' exists without the port mappings "
            "127.0.0.1:9000->30900") in result.output
    assert "run 'michelangelo sandbox delete', then 'michelangelo sandbox create'" \
        in result.output
    assert [c[:2] for c in tools.commands()][-2:] == [["kind", "get"], ["docker", "inspect"]]


def test_a_changed_project_replaces_its_older_runtime_image_here_and_on_the_node(created):
    tools = created
    before = tools.state()
    (old,) = [t for t in before["images"] if t.startswith("michelangelo-sandbox:")]
    assert before["kind_images"] == [old]
    with open(os.path.join(tools.project, "michelangelo", "__init__.py"), "a") as handle:
        handle.write("# changed\n")

    result = tools.invoke("create", "--project-dir", tools.project)
    assert result.exit_code == 0, result.output
    (new,) = [t for t in tools.state()["images"] if t.startswith("michelangelo-sandbox:")]
    assert new != old and tools.state()["kind_images"] == [new]
    assert "1 older one(s) removed" in result.output
    assert "1 older runtime image(s) removed from it" in result.output
    assert [*CTR, "images", "remove", f"docker.io/library/{old}"] in tools.commands()


def test_a_runtime_image_a_container_runs_stays_on_the_node(created):
    tools = created
    (old,) = tools.state()["kind_images"]
    tools.set_state(node_running=[old])  # e.g. a RayService made by an earlier project
    with open(os.path.join(tools.project, "michelangelo", "__init__.py"), "a") as handle:
        handle.write("# changed\n")

    result = tools.invoke("create", "--project-dir", tools.project)
    assert result.exit_code == 0, result.output
    assert old in tools.state()["kind_images"] and len(tools.state()["kind_images"]) == 2
    assert "removed from it" not in result.output
