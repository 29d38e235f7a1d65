"""The project folder a remote Ray job runs in: chosen, listed (gitignore-aware), zipped.

The job's ``working_dir`` is the git work tree that holds the workflow file (or the file's
folder outside git), with exactly the files git would consider: tracked ones plus untracked
ones that no ``.gitignore`` excludes. The zip is byte-for-byte reproducible, so Ray's
content-addressed upload happens once for unchanged code, however many jobs use it.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import zipfile
from dataclasses import dataclass

from michelangelo.quantity import format_bytes
from michelangelo.uniflow.core.errors import UserError

ENV_MAX_MB = "UF_RAY_WORKING_DIR_MAX_MB"
ENV_ROOT = "UF_RAY_WORKING_DIR"
_DEFAULT_MAX_MB = 100
_ALWAYS_SKIPPED = {".git", "__pycache__", ".venv", ".mypy_cache", ".pytest_cache", ".ruff_cache"}
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)


class WorkingDirTooLargeError(UserError):
    """The project folder is too big to travel with each Ray job."""


@dataclass(frozen=True)
class PackedProject:
    """A zipped project folder ready to be a job's ``working_dir``."""

    root: str
    zip_path: str
    files: int
    size: int


def project_root(source_file: str) -> str:
    """``$UF_RAY_WORKING_DIR``, else the git work tree holding ``source_file``, else its folder."""
    override = os.environ.get(ENV_ROOT)
    if override:
        root = os.path.abspath(os.path.expanduser(override))
        if not os.path.isdir(root):
            raise UserError(f"{ENV_ROOT}={override!r} is not a folder; point it at the project.")
        return root
    folder = os.path.dirname(os.path.abspath(source_file))
    found = _git(folder, "rev-parse", "--show-toplevel")
    return found.strip() if found else folder


def max_bytes() -> int:
    raw = os.environ.get(ENV_MAX_MB, str(_DEFAULT_MAX_MB))
    try:
        value = float(raw)
    except ValueError:
        raise UserError(f"{ENV_MAX_MB}={raw!r} is not a number of MiB, e.g. 200.") from None
    return int(value * 2**20)


def list_files(root: str) -> list[str]:
    """Paths (relative to ``root``, sorted) of the files that travel to the cluster."""
    listed = _git(root, "ls-files", "-z", "--cached", "--others", "--exclude-standard")
    if listed is not None:
        names = [n for n in listed.split("\0") if n]
    else:
        names = _walk_with_gitignore(root)
    keep = []
    for name in names:
        parts = name.split("/")
        if _ALWAYS_SKIPPED.intersection(parts):
            continue
        path = os.path.join(root, name)
        if os.path.isfile(path) and not os.path.islink(path):
            keep.append(name)
    return sorted(set(keep))


def pack_project(root: str, destination_dir: str | None = None,
                 limit: int | None = None) -> PackedProject:
    """Zip the project's files; refuse a project over the size limit before zipping.

    Raises:
        WorkingDirTooLargeError: Naming the biggest files and how to leave them out.
    """
    limit = max_bytes() if limit is None else limit
    files = list_files(root)
    sizes = {name: os.path.getsize(os.path.join(root, name)) for name in files}
    total = sum(sizes.values())
    if total > limit:
        biggest = sorted(sizes.items(), key=lambda item: -item[1])[:5]
        listing = ", ".join(f"{name} ({format_bytes(size)})" for name, size in biggest)
        raise WorkingDirTooLargeError(
            f"the project folder {root} goes to the Ray cluster as each job's working_dir, but "
            f"its {len(files)} files hold {format_bytes(total)}, over the limit of "
            f"{format_bytes(limit)}. Biggest: {listing}. Fix: list data and build outputs in "
            f".gitignore (keep data in uniflow storage instead), or raise {ENV_MAX_MB}."
        )
    handle, zip_path = tempfile.mkstemp(prefix="uf-project-", suffix=".zip", dir=destination_dir)
    os.close(handle)
    with zipfile.ZipFile(zip_path, "w", compression=zipfile.ZIP_DEFLATED,
                         compresslevel=1) as archive:
        for name in files:
            info = zipfile.ZipInfo(name, date_time=_ZIP_TIME)
            mode = os.stat(os.path.join(root, name)).st_mode
            info.external_attr = (mode & 0o777 | 0o100000) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            with open(os.path.join(root, name), "rb") as source:
                archive.writestr(info, source.read(), compresslevel=1)
    return PackedProject(root=root, zip_path=zip_path, files=len(files), size=total)


def _git(folder: str, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", folder, *args], capture_output=True, text=True,
                              timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def _walk_with_gitignore(root: str) -> list[str]:
    """Outside git: every file, minus what the root's ``.gitignore`` excludes."""
    from ray._private.thirdparty.pathspec import PathSpec

    patterns: list[str] = []
    ignore = os.path.join(root, ".gitignore")
    if os.path.isfile(ignore):
        with open(ignore, encoding="utf-8", errors="replace") as handle:
            patterns = handle.read().splitlines()
    spec = PathSpec.from_lines("gitwildmatch", patterns)
    out = []
    for folder, dirs, names in os.walk(root):
        rel_folder = os.path.relpath(folder, root)
        dirs[:] = [d for d in dirs if d not in _ALWAYS_SKIPPED
                   and not spec.match_file(os.path.normpath(os.path.join(rel_folder, d)) + "/")]
        for name in names:
            rel = os.path.normpath(os.path.join(rel_folder, name))
            if not spec.match_file(rel):
                out.append(rel.replace(os.sep, "/"))
    return out
