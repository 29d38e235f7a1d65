"""The kind sandbox for real: a Docker engine, ``sandbox create --build-images``, and the
``michelangelo`` CLI run as a user runs it, in subprocesses.

Run by ``make test`` as a step of its own (``tools/make_test.sh``), after the other runs: it
needs a Docker engine (``tools/docker_engine.sh`` starts one where the machine allows it) and
builds or reuses every image. Each test module shares the one sandbox this session creates;
the last test deletes it and checks that nothing of it is left.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), *[".."] * 3))
BIN = os.path.dirname(sys.executable)
KUBECTL_CONTEXT = "kind-michelangelo"
# How the sandbox is made: every image built here (make test, and make sandbox-e2e's default),
# or, set empty, pulled from the registries (make sandbox-e2e SANDBOX_CREATE=).
CREATE_FLAGS = os.environ.get("SANDBOX_CREATE", "--build-images").split()


def cli_env() -> dict[str, str]:
    """A user's shell: the venv on PATH, no storage or cluster of the test suite's."""
    env = dict(os.environ)
    for name in ("UF_STORAGE_URL", "RAY_ADDRESS", "KUBECONFIG", "AWS_ACCESS_KEY_ID",
                 "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL", "FSSPEC_S3_ENDPOINT_URL"):
        env.pop(name, None)
    env["PATH"] = BIN + os.pathsep + env.get("PATH", "")
    return env


def michelangelo(*args: str, timeout: float = 900, check: bool = True
                 ) -> subprocess.CompletedProcess[str]:
    """``michelangelo ARGS`` as a user types it; its output is echoed for the log."""
    started = time.monotonic()
    done = subprocess.run([os.path.join(BIN, "michelangelo"), *args], env=cli_env(),
                          cwd=REPO, capture_output=True, text=True, timeout=timeout)
    took = time.monotonic() - started
    print(f"$ michelangelo {' '.join(args)}  ({took:.1f} s, exit {done.returncode})")
    print(done.stdout[-8000:] + done.stderr[-8000:])
    if check:
        assert done.returncode == 0, (done.stdout + done.stderr)[-8000:]
    return done


def kubectl(*args: str, check: bool = True) -> str:
    from michelangelo.sandbox._commands import find_tool

    done = subprocess.run([find_tool("kubectl") or "kubectl", "--context", KUBECTL_CONTEXT,
                           *args], capture_output=True, text=True, timeout=120)
    if check:
        assert done.returncode == 0, done.stderr
    return done.stdout


def kube_list(kind: str, namespace: str = "michelangelo", selector: str | None = None
              ) -> list[dict]:
    args = ["get", kind, "--namespace", namespace, "--output", "json"]
    if selector:
        args += ["--selector", selector]
    return json.loads(kubectl(*args))["items"]


def docker_names(*args: str) -> set[str]:
    done = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=60,
                          check=True)
    return {line.strip() for line in done.stdout.splitlines() if line.strip()}


def ours_in_docker() -> dict[str, set[str]]:
    """Containers, networks and volumes of Docker's that a sandbox could have made."""
    return {"containers": docker_names("ps", "--all", "--format", "{{.Names}}"),
            "networks": docker_names("network", "ls", "--format", "{{.Name}}"),
            "volumes": docker_names("volume", "ls", "--format", "{{.Name}}"),
            "kind clusters": _kind_clusters()}


def _kind_clusters() -> set[str]:
    from michelangelo.sandbox._commands import find_tool

    kind = find_tool("kind")
    if kind is None:  # a cold machine: create builds kind, so no cluster of its exists yet
        return set()
    done = subprocess.run([kind, "get", "clusters"],
                          capture_output=True, text=True, timeout=60, check=True)
    return set(done.stdout.split())


@pytest.fixture(scope="session")
def before_sandbox() -> dict[str, set[str]]:
    """What Docker held before the sandbox was created."""
    return ours_in_docker()


@pytest.fixture(scope="session")
def sandbox(before_sandbox):
    """The sandbox, created once (``doctor`` first, as the docs say); deleted at the end when
    the last test has not done it already. A sandbox made before (by hand, or by a run that
    was killed, whose node Docker restarts) is deleted first: its RayClusters would take the
    node's room, and the tests count the RayClusters they make."""
    if "michelangelo" in before_sandbox["kind clusters"]:
        michelangelo("sandbox", "delete", timeout=600)
    michelangelo("sandbox", "doctor", *CREATE_FLAGS, timeout=120)
    created = michelangelo("sandbox", "create", *CREATE_FLAGS, timeout=3600)
    try:
        yield created.stdout
    finally:
        if "michelangelo" in _kind_clusters():
            michelangelo("sandbox", "delete", timeout=600, check=False)
