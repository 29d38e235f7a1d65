"""``sandbox doctor``: which of docker, kind, kubectl and helm are here, at which version.

Each tool is found on ``PATH`` and asked for its version; a missing tool, a version below the
minimum, or a Docker engine that does not answer each come with the exact way to fix it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
from dataclasses import dataclass

from michelangelo.sandbox._build_images import base_image_tag
from michelangelo.sandbox._build_steps import image_exists
from michelangelo.sandbox._commands import find_tool
from michelangelo.sandbox._errors import SandboxError

_TIMEOUT_S = 30.0
_VERSION = re.compile(r"v?(\d+)\.(\d+)(?:\.(\d+))?")


@dataclass(frozen=True)
class ToolSpec:
    """A tool the sandbox needs: how to ask its version, the oldest that works, how to get it."""

    name: str
    version_argv: tuple[str, ...]
    minimum: tuple[int, int, int]
    why: str
    install: str


TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec("docker", ("docker", "--version"), (20, 10, 0),
             "runs the kind node and builds the runtime image",
             "install Docker Engine (https://docs.docker.com/engine/install/) or Docker Desktop "
             "(https://docs.docker.com/desktop/), then start it"),
    ToolSpec("kind", ("kind", "version"), (0, 20, 0),
             "runs a Kubernetes cluster inside Docker",
             "go install sigs.k8s.io/kind@v0.24.0, or download a release binary as described at "
             "https://kind.sigs.k8s.io/docs/user/quick-start/#installation"),
    ToolSpec("kubectl", ("kubectl", "version", "--client", "-o", "json"), (1, 25, 0),
             "applies the storage manifests and waits for deployments",
             "install kubectl as described at https://kubernetes.io/docs/tasks/tools/"),
    ToolSpec("helm", ("helm", "version", "--short"), (3, 10, 0),
             "installs the KubeRay operator chart",
             "install Helm 3 as described at https://helm.sh/docs/intro/install/"),
)


@dataclass(frozen=True)
class ToolReport:
    """What ``doctor`` found for one tool."""

    name: str
    path: str | None
    version: str | None
    ok: bool
    problem: str = ""
    fix: str = ""


def parse_version(text: str) -> tuple[int, int, int] | None:
    """The first ``X.Y[.Z]`` in a tool's version output (``kubectl`` answers in JSON)."""
    text = text.strip()
    if text.startswith("{"):
        try:
            text = json.loads(text)["clientVersion"]["gitVersion"]
        except (ValueError, KeyError, TypeError):
            return None
    match = _VERSION.search(text)
    if match is None:
        return None
    return int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)


def check_tool(spec: ToolSpec) -> ToolReport:
    """Find one tool, read its version and compare it with the minimum."""
    path = find_tool(spec.name)
    if path is None:
        return ToolReport(spec.name, None, None, False, f"not found on PATH (it {spec.why})",
                          spec.install)
    try:
        done = subprocess.run([path, *spec.version_argv[1:]], capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, timeout=_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return ToolReport(spec.name, path, None, False, f"'{' '.join(spec.version_argv)}' "
                          f"did not run: {exc}", spec.install)
    version = parse_version(done.stdout) if done.returncode == 0 else None
    if version is None:
        return ToolReport(spec.name, path, None, False,
                          f"'{' '.join(spec.version_argv)}' gave no version "
                          f"(exit {done.returncode})", spec.install)
    shown = ".".join(map(str, version))
    if version < spec.minimum:
        need = ".".join(map(str, spec.minimum))
        return ToolReport(spec.name, path, shown, False,
                          f"version {shown} is older than the {need} the sandbox needs",
                          f"upgrade {spec.name} to {need} or newer: {spec.install}")
    return ToolReport(spec.name, path, shown, True)


def check_docker_engine() -> ToolReport:
    """Whether the Docker engine answers (the client alone cannot run kind)."""
    path = shutil.which("docker")
    fix = "start Docker (Docker Desktop, or 'sudo systemctl start docker') and make sure this " \
          "user may use it (e.g. member of the 'docker' group)"
    if path is None:
        return ToolReport("docker engine", None, None, False, "no docker client", fix)
    try:
        done = subprocess.run([path, "info", "--format", "{{.ServerVersion}}"],
                              capture_output=True, text=True, stdin=subprocess.DEVNULL,
                              timeout=_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return ToolReport("docker engine", path, None, False, f"'docker info' failed: {exc}",
                          fix)
    server = done.stdout.strip()
    if done.returncode != 0 or not server:
        reason = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no answer"]
        return ToolReport("docker engine", path, None, False,
                          f"the engine does not answer: {reason[0]}", fix)
    return ToolReport("docker engine", path, server, True)


def doctor(build_images: bool = False) -> list[ToolReport]:
    """Every tool's report, then the Docker engine's (only when the client is present).

    Args:
        build_images: Check for ``create --build-images`` instead: kind and kubectl are then
            built at pinned versions when missing and helm is not used, while Go and
            debootstrap (run as root) are needed.
    """
    reports = [check_tool(spec) for spec in TOOLS]
    if build_images:
        reports = [r if r.ok or r.name == "docker" else
                   ToolReport(r.name, r.path, r.version, True,
                              fix="not needed: --build-images builds it" if r.name != "helm"
                              else "not needed with --build-images")
                   for r in reports]
        reports.extend(check_build_tools())
    if reports[0].ok:
        engine = check_docker_engine()
        reports.append(engine)
        if engine.ok:
            reports.extend(check_engine_setup())
    return reports


# Capability names by bit, as in linux/capability.h (what a bounding set may lack).
_CAPABILITIES = (
    "CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID",
    "SETPCAP", "LINUX_IMMUTABLE", "NET_BIND_SERVICE", "NET_BROADCAST", "NET_ADMIN", "NET_RAW",
    "IPC_LOCK", "IPC_OWNER", "SYS_MODULE", "SYS_RAWIO", "SYS_CHROOT", "SYS_PTRACE",
    "SYS_PACCT", "SYS_ADMIN", "SYS_BOOT", "SYS_NICE", "SYS_RESOURCE", "SYS_TIME",
    "SYS_TTY_CONFIG", "MKNOD", "LEASE", "AUDIT_WRITE", "AUDIT_CONTROL", "SETFCAP",
    "MAC_OVERRIDE", "MAC_ADMIN", "SYSLOG", "WAKE_ALARM", "BLOCK_SUSPEND", "AUDIT_READ",
    "PERFMON", "BPF", "CHECKPOINT_RESTORE",
)
# The runtime that passes runc only what this machine grants (tools/docker_engine.sh
# registers it under this name).
CAPFILTER_RUNTIME = "capfilter"


def missing_capabilities(status_text: str, last_cap: int) -> list[str]:
    """Capabilities up to ``last_cap`` that a ``/proc/<pid>/status`` bounding set lacks."""
    for line in status_text.splitlines():
        if line.startswith("CapBnd:"):
            mask = int(line.split(":", 1)[1].strip(), 16)
            return [f"CAP_{name}" for bit, name in enumerate(_CAPABILITIES[:last_cap + 1])
                    if not mask & (1 << bit)]
    return []


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except OSError:
        return ""


def check_engine_setup() -> list[ToolReport]:
    """The engine's storage and cgroup drivers, the cgroup version, and whether privileged
    containers (the kind node) can start here: kind needs them all."""
    info = engine_info()
    if info is None:
        return [ToolReport("engine setup", None, None, False, "'docker info' gave no JSON",
                           "check that the engine runs: docker info")]
    reports = []
    driver = info.get("Driver") or "?"
    reports.append(ToolReport(
        "storage driver", None, driver, driver in ("overlay2", "overlayfs", "btrfs", "zfs"),
        f"'{driver}' cannot hold the node's images well",
        "run the engine with the overlay2 storage driver (dockerd --storage-driver overlay2)"))
    cgroup_driver, cgroup_version = info.get("CgroupDriver") or "?", info.get("CgroupVersion")
    reports.append(ToolReport(
        "cgroups", None, f"{cgroup_driver}/v{cgroup_version}", cgroup_driver != "none",
        "the engine runs without cgroups", "run the engine where cgroups are mounted"))
    if not engine_on_this_machine(info):
        # An engine on another host (Docker Desktop's VM, a remote daemon): its capabilities
        # and folders are not this machine's, and kind's own checks speak for them.
        return reports
    last_cap = int(_read("/proc/sys/kernel/cap_last_cap").strip() or len(_CAPABILITIES) - 1)
    missing = missing_capabilities(_read("/proc/self/status"), last_cap)
    runtime = info.get("DefaultRuntime") or "runc"
    if missing and runtime != CAPFILTER_RUNTIME:
        reports.append(ToolReport(
            "capabilities", None, f"lacks {','.join(missing)}", False,
            f"this machine's bounding set lacks {', '.join(missing)}, which runc asks for in "
            f"privileged containers, and the engine's default runtime is '{runtime}'",
            "start the engine with the runtime that drops what the machine cannot grant: "
            "bash tools/docker_engine.sh start (it builds runc-capfilter and registers it "
            f"with dockerd --add-runtime {CAPFILTER_RUNTIME}=... --default-runtime "
            f"{CAPFILTER_RUNTIME})"))
    else:
        shown = f"lacks {','.join(missing)}; runtime {runtime}" if missing else "all held"
        reports.append(ToolReport("capabilities", None, shown, True))
    modules = os.path.isdir("/lib/modules")
    reports.append(ToolReport(
        "/lib/modules", None, "present" if modules else "missing", modules,
        "kind mounts /lib/modules into its node and Docker refuses a missing folder",
        "create it (sudo mkdir -p /lib/modules); tools/docker_engine.sh start does"))
    return reports


def engine_info() -> dict | None:
    """What ``docker info`` says of the engine, as a dict; None when it gives no JSON (no
    engine answers)."""
    done = subprocess.run(["docker", "info", "--format", "{{json .}}"], capture_output=True,
                          text=True, stdin=subprocess.DEVNULL, timeout=_TIMEOUT_S, check=False)
    try:
        info = json.loads(done.stdout)
    except ValueError:
        return None
    return info if isinstance(info, dict) else None


def engine_on_this_machine(info: dict) -> bool:
    """Whether the engine ``docker info`` described runs on this machine, so that its
    containers see this machine's folders (not Docker Desktop's VM, nor a remote daemon)."""
    return info.get("Name") == socket.gethostname()


def _present_base_image() -> str | None:
    """The Debian base image's tag when Docker already holds it."""
    try:
        tag = base_image_tag()
        return tag if image_exists(tag) else None
    except SandboxError:
        return None  # no Debian for this Python (the create step says so), or no docker


def check_build_tools() -> list[ToolReport]:
    """What ``--build-images`` needs: Go (and a module proxy), debootstrap, and root."""
    reports = [check_tool(ToolSpec(
        "go", ("go", "version"), (1, 26, 0), "builds Kubernetes, kind, etcd, CoreDNS, KubeRay "
        "and MinIO from the Go module proxy", "install Go 1.26 or newer (https://go.dev/dl)"))]
    base = _present_base_image()
    if base is not None:  # made by an earlier create: debootstrap is not needed again
        reports.append(ToolReport("debootstrap", base, "not needed", True))
        return reports
    path = shutil.which("debootstrap")
    root = os.geteuid() == 0
    reports.append(ToolReport(
        "debootstrap", path, "root" if root else "not root", bool(path) and root,
        "missing" if not path else "the base image needs debootstrap run as root",
        "apt-get install debootstrap, and run 'sudo michelangelo sandbox create "
        "--build-images' (later runs reuse the image)"))
    return reports
