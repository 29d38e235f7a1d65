"""RECORDING STAND-INS (test doubles) for ``docker``, ``kind``, ``kubectl`` and ``helm``.

No Docker engine runs on the test machines, so the sandbox's commands meet these instead.
:func:`install` writes one tiny shell wrapper per tool into a folder that the tests put alone
on ``PATH``; each wrapper runs this file, which

- appends ``{"tool", "argv", "stdin", "seen"}`` to a JSON-lines record (``seen`` keeps the
  files a command was pointed at: kind's config, the Docker build context), and
- answers from a JSON state file the way the real tool would answer in that state, and
  updates it: ``kind get clusters`` lists what ``kind create cluster`` made, ``kubectl apply``
  reports ``created``/``unchanged``/``configured``, ``kind delete cluster`` takes the helm
  release and every object with it.

Only the subcommands the sandbox uses are known; anything else fails loudly (exit 97) so a
new command cannot pass unnoticed. Runs with ``python -I -S`` (standard library only).
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import json
import os
import sys

STATE_ENV = "SANDBOX_DOUBLE_STATE"
RECORD_ENV = "SANDBOX_DOUBLE_RECORD"
TOOLS = ("docker", "kind", "kubectl", "helm")

DEFAULT_STATE = {
    "versions": {
        "docker": "Docker version 27.3.1, build ce12230",
        "kind": "kind v0.24.0 go1.22.6 linux/amd64",
        "kubectl": json.dumps({"clientVersion": {"major": "1", "minor": "31",
                                                 "gitVersion": "v1.31.1"}}),
        "helm": "v3.16.2+g13654a5",
    },
    "engine": "27.3.1",
    "clusters": [],
    "node_ports": {},
    "contexts": [],
    "images": [],
    "kind_images": [],
    "helm_repos": {},
    "releases": {},
    "objects": {},
}


def install(folder: str, state_path: str, record_path: str,
            tools: tuple[str, ...] = TOOLS) -> None:
    """Write the wrappers for ``tools`` into ``folder`` and a fresh state file."""
    os.makedirs(folder, exist_ok=True)
    for tool in tools:
        path = os.path.join(folder, tool)
        with open(path, "w") as handle:
            handle.write(f"#!/bin/sh\nexec '{sys.executable}' -I -S '{os.path.abspath(__file__)}'"
                         f" {tool} '{state_path}' '{record_path}' \"$@\"\n")
        os.chmod(path, 0o755)
    with open(state_path, "w") as handle:
        json.dump(DEFAULT_STATE, handle)


def read_record(record_path: str) -> list[dict]:
    """Every recorded call, oldest first."""
    if not os.path.exists(record_path):
        return []
    with open(record_path) as handle:
        return [json.loads(line) for line in handle if line.strip()]


class _Fail(Exception):
    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def _flag(argv: list[str], name: str) -> str | None:
    """Remove ``name VALUE`` (or ``name=VALUE``) from argv and return VALUE."""
    for i, arg in enumerate(argv):
        if arg == name:
            value = argv[i + 1]
            del argv[i:i + 2]
            return value
        if arg.startswith(name + "="):
            del argv[i]
            return arg.split("=", 1)[1]
    return None


def _docker(argv: list[str], state: dict, seen: dict, stdin: str = "") -> str:
    if argv == ["--version"]:
        return state["versions"]["docker"]
    if argv[:1] == ["info"]:
        if not state["engine"]:
            raise _Fail("Cannot connect to the Docker daemon at unix:///var/run/docker.sock. "
                        "Is the docker daemon running?")
        # The fields `docker info --format` templates ask for; an engine on another host, as
        # Docker Desktop's VM is (so the doctor does not judge this machine's capabilities).
        info = {"ServerVersion": state["engine"], "Driver": "overlay2",
                "CgroupDriver": "systemd", "CgroupVersion": "2", "DefaultRuntime": "runc",
                "Name": "docker-desktop", "OperatingSystem": "Docker Desktop"}
        template = argv[argv.index("--format") + 1] if "--format" in argv else ""
        if template == "{{json .}}":
            return json.dumps(info)
        for key, value in info.items():
            if template == "{{." + key + "}}":
                return value
        return state["engine"]
    if argv[:1] == ["inspect"]:
        node = argv[-1]
        cluster = node.removesuffix("-control-plane")
        if cluster not in state["clusters"]:
            raise _Fail(f"Error response from daemon: No such object: {node}")
        bindings = {"6443/tcp": [{"HostIp": "127.0.0.1", "HostPort": "41234"}]}
        for m in state["node_ports"].get(cluster, []):
            bindings[f"{m['containerPort']}/tcp"] = [{"HostIp": m.get("listenAddress",
                                                                       "0.0.0.0"),
                                                      "HostPort": str(m["hostPort"])}]
        return json.dumps(bindings)
    if argv[:2] == ["network", "inspect"]:
        # kind's network outlives the clusters; containers are attached while one runs
        if argv[2] not in state.setdefault("networks", []):
            raise _Fail(f"Error response from daemon: network {argv[2]} not found")
        return str(len(state["clusters"]))
    if argv[:2] == ["network", "rm"]:
        state["networks"].remove(argv[2])
        return argv[2]
    if argv[:1] == ["images"]:  # docker images REPOSITORY --format {{.Repository}}:{{.Tag}}
        return "\n".join(tag for tag in state["images"] if tag.split(":")[0] == argv[1])
    if argv[:2] == ["image", "rm"]:
        state["images"].remove(argv[2])
        return f"Untagged: {argv[2]}"
    if argv[:2] == ["exec", "-i"] and argv[3:6] == ["ctr", "--namespace", "k8s.io"] \
            and argv[6:8] == ["images", "import"] and argv[-1] == "-":
        # what 'docker save' streamed in (the stand-in's archive names its tags)
        for tag in json.loads(stdin)["archive"]:
            if tag not in state["kind_images"]:
                state["kind_images"].append(tag)
        return "unpacking ... done"
    if argv[:1] == ["exec"] and argv[2:] == ["containerd", "config", "dump"]:
        return ('[plugins."io.containerd.grpc.v1.cri".containerd]\n'
                '  snapshotter = "overlayfs"\n')
    if argv[:1] == ["exec"] and argv[2:5] == ["ctr", "--namespace", "k8s.io"]:
        # the node's containerd names an imported image as ctr import does (docker.io/library/)
        what = argv[5:]
        labels = state.setdefault("node_labels", {})
        if what == ["images", "list"]:
            return "REF TYPE DIGEST SIZE PLATFORMS LABELS\n" + "\n".join(
                f"docker.io/library/{tag} application/vnd.docker.distribution.manifest.v2+json "
                f"sha256:{'1' * 64} 1.2 GiB linux/amd64 "
                + (f"michelangelo.sandbox/docker-image-id={labels[tag]}" if tag in labels
                   else "-")
                for tag in state["kind_images"])
        if what[:2] == ["images", "label"]:
            tag = what[2].removeprefix("docker.io/library/")
            if tag not in state["kind_images"]:
                raise _Fail(f"ctr: image \"{what[2]}\": not found")
            labels[tag] = what[3].split("=", 1)[1]
            return what[2]
        if what == ["containers", "list"]:
            return "CONTAINER    IMAGE    RUNTIME\n" + "\n".join(
                f"c{i}    docker.io/library/{tag}    io.containerd.runc.v2"
                for i, tag in enumerate(state.get("node_running", [])))
        if what[:2] == ["images", "remove"]:
            state["kind_images"].remove(what[2].removeprefix("docker.io/library/"))
            return what[2]
    if argv[:2] == ["image", "inspect"]:  # [--format TEMPLATE] TAG...
        tags = argv[4:] if argv[2:3] == ["--format"] else argv[2:]
        for tag in tags:
            if tag not in state["images"]:
                raise _Fail(f"Error response from daemon: No such image: {tag}")
        if argv[2:4] == ["--format", "{{.Id}}"]:
            return "\n".join(image_id(tag) for tag in tags)
        return json.dumps([{"RepoTags": [tag]} for tag in tags])
    if argv[:1] == ["save"]:
        for tag in argv[1:]:
            if tag not in state["images"]:
                raise _Fail(f"Error response from daemon: reference does not exist: {tag}")
        return json.dumps({"archive": argv[1:]})
    if argv[:1] == ["build"]:
        args = argv[1:]
        tag = _flag(args, "--tag")
        dockerfile = _flag(args, "--file")
        build_args = []
        while (value := _flag(args, "--build-arg")) is not None:
            build_args.append(value)
        (context,) = args
        files = sorted(os.path.relpath(os.path.join(d, f), context)
                       for d, _, names in os.walk(context) for f in names)
        with open(dockerfile) as handle:
            seen["dockerfile"] = handle.read()
        seen["context_files"] = files
        seen["build_args"] = sorted(build_args)
        state["images"].append(tag)
        return f"Successfully tagged {tag}"
    raise _Fail(f"docker stand-in does not know {argv}", 97)


def image_id(tag: str) -> str:
    return "sha256:" + hashlib.sha256(tag.encode()).hexdigest()


def _kind(argv: list[str], state: dict, seen: dict) -> str:
    if argv == ["version"]:
        return state["versions"]["kind"]
    if argv == ["get", "clusters"]:
        if not state["clusters"]:
            sys.stderr.write("No kind clusters found.\n")
        return "\n".join(state["clusters"])
    args = list(argv[2:])
    name = _flag(args, "--name") or "kind"
    if argv[:2] == ["create", "cluster"]:
        if name in state["clusters"]:
            raise _Fail(f'ERROR: failed to create cluster: node(s) already exist for a cluster '
                        f'with the name "{name}"')
        config = _flag(args, "--config")
        with open(config) as handle:
            seen["config"] = json.load(handle)
        state["clusters"].append(name)
        state["contexts"].append(f"kind-{name}")
        if "kind" not in state.setdefault("networks", []):
            state["networks"].append("kind")
        state["node_ports"][name] = seen["config"]["nodes"][0].get("extraPortMappings", [])
        return f"Creating cluster \"{name}\" ...\nSet kubectl context to \"kind-{name}\""
    if name not in state["clusters"]:
        raise _Fail(f'ERROR: unknown cluster "{name}"')
    if argv[:2] == ["export", "kubeconfig"]:
        if f"kind-{name}" not in state["contexts"]:
            state["contexts"].append(f"kind-{name}")
        return f"Set kubectl context to \"kind-{name}\""
    if argv[:2] == ["delete", "cluster"]:
        state["clusters"].remove(name)
        state["contexts"].remove(f"kind-{name}")
        state["node_ports"].pop(name, None)
        state.update(kind_images=[], releases={}, objects={})
        return f"Deleting cluster \"{name}\" ..."
    raise _Fail(f"kind stand-in does not know {argv}", 97)


def _helm(argv: list[str], state: dict, seen: dict) -> str:
    if argv == ["version", "--short"]:
        return state["versions"]["helm"]
    args = list(argv)
    context = _flag(args, "--kube-context")
    namespace = _flag(args, "--namespace") or "default"
    if args[:2] == ["repo", "add"]:
        state["helm_repos"][args[2]] = args[3]
        return f"\"{args[2]}\" has been added to your repositories"
    _context(context, state)
    if args[:1] == ["list"]:
        return json.dumps([{"name": name, "namespace": rel["namespace"], "chart": rel["chart"],
                            "status": rel["status"]} for name, rel in state["releases"].items()
                           if rel["namespace"] == namespace])
    if args[:2] == ["upgrade", "--install"]:
        release, chart = args[2], args[3]
        version = _flag(args, "--version")
        repo = chart.split("/")[0]
        if repo not in state["helm_repos"]:
            raise _Fail(f'Error: repo {repo} not found')
        state["releases"][release] = {"namespace": namespace, "status": "deployed",
                                      "chart": f"{chart.split('/')[1]}-{version}"}
        state["objects"][f"Deployment/{namespace}/{release}"] = {
            "kind": "Deployment", "metadata": {"name": release, "namespace": namespace},
            "status": {"replicas": 1, "readyReplicas": 1}}
        return f"Release \"{release}\" has been upgraded. Happy Helming!"
    raise _Fail(f"helm stand-in does not know {argv}", 97)


def _context(context: str | None, state: dict) -> None:
    if context not in state["contexts"]:
        raise _Fail(f'error: context "{context}" does not exist')


_KINDS = {"secret": "Secret", "deployment": "Deployment", "job": "Job",
          "rayclusters": "RayCluster"}


def _kubectl(argv: list[str], state: dict, seen: dict, stdin: str) -> str:
    if argv[:2] == ["version", "--client"]:
        return state["versions"]["kubectl"]
    args = list(argv)
    _context(_flag(args, "--context"), state)
    namespace = _flag(args, "--namespace") or "default"
    output = _flag(args, "--output")
    objects = state["objects"]
    if args[:1] == ["apply"]:
        assert _flag(args, "--filename") == "-", args
        lines = []
        for item in json.loads(stdin)["items"]:
            item = dict(item)
            if item["kind"] == "Secret" and "stringData" in item:
                # the API server folds stringData into data; kubectl's last-applied
                # annotation keeps stringData, so each apply of it is a change
                item["data"] = {k: base64.b64encode(v.encode()).decode()
                                for k, v in item.pop("stringData").items()}
                item["_string_data_applied"] = objects.get(
                    f"Secret/{item['metadata'].get('namespace', '')}/"
                    f"{item['metadata']['name']}", {}).get("_string_data_applied", 0) + 1
            ns = item["metadata"].get("namespace", "")
            key = f"{item['kind']}/{ns}/{item['metadata']['name']}"
            if item["kind"] == "Deployment":
                item["status"] = {"replicas": 1, "readyReplicas": 1}
            if item["kind"] == "Job":
                item["status"] = {"succeeded": 1}
            verb = "created" if key not in objects else \
                "unchanged" if objects[key] == item else "configured"
            objects[key] = item
            lines.append(f"{item['kind'].lower()}/{item['metadata']['name']} {verb}")
        return "\n".join(lines)
    if args[:1] == ["get"]:
        kind = _KINDS[args[1]]
        if kind == "RayCluster":
            if "kuberay-operator" not in state["releases"]:
                raise _Fail('error: the server doesn\'t have a resource type "rayclusters"')
            items = [o for k, o in objects.items() if k.startswith(f"RayCluster/{namespace}/")]
            return json.dumps({"items": items})
        found = objects.get(f"{kind}/{namespace}/{args[2]}")
        assert output == "json", args
        if found is None:
            if "--ignore-not-found" in args:
                return ""
            raise _Fail(f'Error from server (NotFound): {args[1]} "{args[2]}" not found')
        return json.dumps(found)
    if args[:2] == ["rollout", "status"]:
        name = args[2].split("/", 1)[1]
        if f"Deployment/{namespace}/{name}" not in objects:
            raise _Fail(f'Error from server (NotFound): deployments.apps "{name}" not found')
        return f'deployment "{name}" successfully rolled out'
    if args[:1] == ["wait"]:
        target = next(a for a in args[1:] if a.startswith("job/"))
        name = target.split("/", 1)[1]
        if f"Job/{namespace}/{name}" not in objects:
            raise _Fail(f'Error from server (NotFound): jobs.batch "{name}" not found')
        return f"job.batch/{name} condition met"
    raise _Fail(f"kubectl stand-in does not know {argv}", 97)


def main() -> int:
    tool, state_path, record_path, *argv = sys.argv[1:]
    # Only 'kubectl apply --filename -' and 'docker exec -i' (an image stream) read their
    # input, as with the real tools.
    reads = (tool == "kubectl" and "-" in argv) or (tool == "docker" and argv[:2] == ["exec",
                                                                                     "-i"])
    stdin = sys.stdin.read() if reads else ""
    seen: dict = {}
    code, out, err = 0, "", ""
    # An image load runs beside other commands: one command at a time reads and writes the
    # state and the record.
    with open(state_path + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with open(state_path) as handle:
            state = json.load(handle)
        try:
            if tool == "kubectl":
                out = _kubectl(argv, state, seen, stdin)
            elif tool == "docker":
                out = _docker(argv, state, seen, stdin)
            else:
                out = {"kind": _kind, "helm": _helm}[tool](argv, state, seen)
        except _Fail as exc:
            code, err = exc.code, str(exc)
        with open(record_path, "a") as handle:
            handle.write(json.dumps({"tool": tool, "argv": argv, "stdin": stdin, "seen": seen,
                                     "exit": code}) + "\n")
        if code == 0:
            with open(state_path, "w") as handle:
                json.dump(state, handle)
    if out:
        sys.stdout.write(out + "\n")
    if err:
        sys.stderr.write(err + "\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
