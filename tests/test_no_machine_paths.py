"""No tracked file names a folder that exists only on some machines.

A path such as a home folder, a CI workspace or a mirror of other repositories works where it
was written and nowhere else; a default built on one fails quietly on every other machine.
Read from ``git ls-files``, so only what is committed counts.
"""

from __future__ import annotations

import pathlib
import re
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent

# Absolute home, workspace and mirror folders. The lookbehind keeps URLs and longer paths out
# (``https://example.org/work/``, ``/srv/root/``): only a path that starts there counts.
MACHINE_PATH = re.compile(r"(?<![\w./])(?:/home/[\w.-]+/|/root/|/work/|/Users/)|/\.mirror\b")

# "file:line" -> why that line names no machine's folder.
ALLOWED = {
    # The working folder inside the sandbox's runtime image: rayproject/ray's user is `ray`.
    "michelangelo/sandbox/Dockerfile:13",
}
# Files that name the patterns themselves.
SKIPPED = {"tests/test_no_machine_paths.py"}


def _tracked_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
    return [name for name in out.stdout.decode().split("\0") if name]


def machine_paths(root: pathlib.Path, files: list[str]) -> list[str]:
    """``file:line: text`` for every line of ``files`` (under ``root``) naming a machine path."""
    found = []
    for name in files:
        if name in SKIPPED:
            continue
        try:
            text = (root / name).read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue  # binary files, and files deleted but not yet committed
        for number, line in enumerate(text.splitlines(), 1):
            if MACHINE_PATH.search(line) and f"{name}:{number}" not in ALLOWED:
                found.append(f"{name}:{number}: {line.strip()}")
    return found


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(),
                    reason="needs a git checkout")
def test_tracked_files_name_no_machine_paths():
    found = machine_paths(ROOT, _tracked_files())
    assert not found, (
        "These lines name a folder that exists only on some machines (a home folder, a "
        "workspace, a mirror). Take it from a variable or the user's home (~, $HOME) instead, "
        "or add the line to ALLOWED with the reason it is no machine's path:\n"
        + "\n".join(found))


def test_the_check_finds_machine_paths_and_not_urls(tmp_path):
    lines = ["a=/home/someone/src", "b='/root/.cache'", "c=/work/main/x", "d=/Users/me/x",
             "e=$X/.mirror/repo", "f=https://example.org/work/x", "g=~/.cache/michelangelo",
             "h=/srv/root/x", "i=${X:-/work/y}", "j=PATH=/bin:/root/bin"]
    (tmp_path / "f.txt").write_text("\n".join(lines))
    assert [hit.split(":")[1] for hit in machine_paths(tmp_path, ["f.txt"])] == [
        "1", "2", "3", "4", "5", "9", "10"]
