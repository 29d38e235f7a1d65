"""The building blocks of an image build: the cache folder, Go builds, Docker builds.

Every build lands in the user's cache (``$MICHELANGELO_CACHE``, else
``$XDG_CACHE_HOME/michelangelo``, else ``~/.cache/michelangelo``) or in Docker under a tag that
names its version, and each step first looks whether its result exists: a second build of
the same versions does nothing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from michelangelo.sandbox._commands import run, tail
from michelangelo.sandbox._errors import SandboxError
from michelangelo.sandbox._settings import cache_root

# The build's inputs: Dockerfiles, the node's files and small Go programs (files/), and the
# script that builds Go programs from the module proxy.
FILES = Path(__file__).resolve().parent / "_build" / "files"
GO_BUILD = Path(__file__).resolve().parent / "_build" / "go_proxy_build.sh"
_GO_TIMEOUT_S = 3600.0
_BUILD_TIMEOUT_S = 3600.0


def go_build(*target: str, versions: dict[str, str] | None = None) -> Path:
    """Run one target of ``go_proxy_build.sh``; returns the folder holding its programs.

    ``versions`` sets the script's version variables (``K8S_VERSION``, ``KIND_VERSION``, ...),
    so that the caller's pins are the ones built.

    Raises:
        SandboxError: Go is missing, or the build failed (with the tail of its log).
    """
    if shutil.which("go") is None:
        raise SandboxError("building the sandbox's images needs the Go toolchain (go 1.26 or "
                           "newer, https://go.dev/dl) and access to a Go module proxy.")
    env = dict(os.environ, **(versions or {}), MICHELANGELO_CACHE=str(cache_root()))
    try:
        done = subprocess.run(["bash", str(GO_BUILD), *target], capture_output=True, text=True,
                              env=env, stdin=subprocess.DEVNULL, timeout=_GO_TIMEOUT_S,
                              check=False)
    except subprocess.TimeoutExpired:
        raise SandboxError(f"the Go build of {' '.join(target)} took over "
                           f"{_GO_TIMEOUT_S:.0f} s.") from None
    if done.returncode != 0:
        raise SandboxError(f"the Go build of {' '.join(target)} failed:\n{tail(done.stderr)}")
    return Path(done.stdout.strip().splitlines()[-1])


def image_exists(tag: str) -> bool:
    """Whether Docker holds an image under this tag."""
    return run(("docker", "image", "inspect", "--format", "{{.Id}}", tag),
               check=False).returncode == 0


def docker_build(tag: str, context: Path, build_args: dict[str, str] | None = None) -> None:
    """``docker build`` of a prepared context (its ``Dockerfile``) under ``tag``."""
    args = [arg for key, value in sorted((build_args or {}).items())
            for arg in ("--build-arg", f"{key}={value}")]
    run(("docker", "build", "--quiet", "--tag", tag, *args, str(context)),
        timeout=_BUILD_TIMEOUT_S)


def binary_image(tag: str, binary: Path, *, name: str | None = None, base: str = "scratch",
                 packages: Sequence[str] = (), entrypoint: bool = False,
                 user: str | None = None) -> None:
    """An image holding one static program at ``/usr/local/bin/<name>``, on ``base`` with
    Debian's ``packages`` installed beside it (a Debian ``base`` is needed for those)."""
    name = name or binary.name
    with tempfile.TemporaryDirectory(prefix="michelangelo-image-") as folder:
        context = Path(folder)
        shutil.copy2(binary.resolve(), context / name)
        lines = [f"FROM {base}"]
        if packages:
            lines.append("RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get "
                         f"install -y -qq --no-install-recommends {' '.join(packages)} "
                         "&& apt-get clean && rm -rf /var/lib/apt/lists/*")
        lines += [f"COPY {name} /usr/local/bin/{name}",
                  "ENV PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]
        if user:
            lines.append(f"USER {user}")
        if entrypoint:
            lines.append(f'ENTRYPOINT ["/usr/local/bin/{name}"]')
        (context / "Dockerfile").write_text("\n".join(lines) + "\n")
        docker_build(tag, context)


class Builds:
    """Runs each image's build once, timing it and saying what it did."""

    def __init__(self, echo: Callable[[str], None]) -> None:
        self.echo = echo
        self.timings: dict[str, float] = {}

    def ensure(self, tag: str, build: Callable[[], None], what: str) -> str:
        """Build ``tag`` unless Docker has it; returns the tag."""
        if image_exists(tag):
            self.echo(f"      {tag}: present, kept")
            self.timings.setdefault(tag, 0.0)
            return tag
        started = time.monotonic()
        build()
        took = time.monotonic() - started
        self.timings[tag] = took
        self.echo(f"      {tag}: built ({what}) in {took:.1f} s")
        return tag


def save_images(tags: Sequence[str], folder: Path) -> None:
    """``docker save`` each tag into its own tarball in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    for tag in tags:
        name = tag.replace("/", "_").replace(":", "_") + ".tar"
        run(("docker", "save", "--output", str(folder / name), tag), timeout=_BUILD_TIMEOUT_S)
