"""``sandbox doctor``: which of docker, kind, kubectl and helm are here, at which version.

Each tool is found on ``PATH`` and asked for its version; a missing tool, a version below the
minimum, or a Docker engine that does not answer each come with the exact way to fix it.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import dataclass

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
    path = shutil.which(spec.name)
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


def doctor() -> list[ToolReport]:
    """Every tool's report, then the Docker engine's (only when the client is present)."""
    reports = [check_tool(spec) for spec in TOOLS]
    if reports[0].ok:
        reports.append(check_docker_engine())
    return reports
