"""The sandbox runtime image: the shipped Dockerfile over a small build context.

The context holds only what ``pip install .`` needs (``pyproject.toml``, ``constraints.txt``,
``README.md`` and the ``michelangelo`` package), not a checkout's virtualenv or data. The tag is
a hash of that context, so an unchanged project is never rebuilt, and a changed one gets a
new tag that pods pull afresh (a ``:latest`` tag would make Kubernetes try a registry).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
from dataclasses import dataclass
from importlib import metadata

from michelangelo.sandbox._errors import SandboxError

IMAGE_REPOSITORY = "michelangelo-sandbox"
DOCKERFILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "Dockerfile")
_PROJECT_FILES = ("pyproject.toml", "constraints.txt", "README.md")
_SKIP_DIRS = {"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache"}


@dataclass(frozen=True)
class ImagePlan:
    """How to build the runtime image: tag, base image, build arguments and Dockerfile."""

    tag: str
    base_image: str
    build_args: dict[str, str]
    dockerfile: str = DOCKERFILE


def find_project_root(start: str | None = None) -> str:
    """The source checkout this package was installed from (it holds ``pyproject.toml``).

    Raises:
        SandboxError: The package was not installed from a checkout.
    """
    here = start or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if all(os.path.isfile(os.path.join(here, name)) for name in _PROJECT_FILES[:2]):
        return here
    raise SandboxError(
        f"no pyproject.toml and constraints.txt in {here}: the runtime image installs this "
        "project from its source, so install michelangelo from a checkout (pip install -e .) "
        "or pass --project-dir DIR.")


def base_image(ray_version: str | None = None) -> str:
    """``rayproject/ray`` at this client's Ray and Python versions (as RayClusters expect)."""
    version = ray_version or metadata.version("ray")
    return f"rayproject/ray:{version}-py{sys.version_info.major}{sys.version_info.minor}"


def context_files(project_root: str) -> list[str]:
    """Paths, relative to the root, that go into the build context, sorted."""
    files = [name for name in _PROJECT_FILES if os.path.isfile(os.path.join(project_root, name))]
    package = os.path.join(project_root, "michelangelo")
    for folder, dirs, names in os.walk(package):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS)
        for name in sorted(names):
            if not name.endswith((".pyc", ".pyo")):
                files.append(os.path.relpath(os.path.join(folder, name), project_root))
    return sorted(files)


def plan_image(project_root: str, base: str | None = None,
               dockerfile: str = DOCKERFILE) -> ImagePlan:
    """The tag (a hash of Dockerfile, base image and context) and build arguments.

    Args:
        project_root: The checkout to install.
        base: The image to build on (default: ``rayproject/ray`` at this client's versions).
        dockerfile: The Dockerfile (default: the one for the ``rayproject/ray`` base).
    """
    base = base or base_image()
    args = {"BASE_IMAGE": base}
    digest = hashlib.sha256()
    with open(dockerfile, "rb") as handle:
        digest.update(handle.read())
    digest.update(repr(sorted(args.items())).encode())
    for rel in context_files(project_root):
        digest.update(rel.encode() + b"\0")
        with open(os.path.join(project_root, rel), "rb") as handle:
            digest.update(handle.read())
    return ImagePlan(f"{IMAGE_REPOSITORY}:{digest.hexdigest()[:12]}", base, args, dockerfile)


def write_context(project_root: str, target: str, dockerfile: str = DOCKERFILE) -> str:
    """Copy the context and the Dockerfile into ``target``; returns the Dockerfile's path."""
    for rel in context_files(project_root):
        dest = os.path.join(target, rel)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copy2(os.path.join(project_root, rel), dest)
    copied = os.path.join(target, "Dockerfile")
    shutil.copy2(dockerfile, copied)
    return copied
