"""The project folder a remote job runs in: gitignore-aware listing and the size limit."""

from __future__ import annotations

import subprocess
import zipfile

import pytest

from michelangelo.uniflow.plugins.ray._remote._working_dir import (
    WorkingDirTooLargeError,
    list_files,
    pack_project,
    project_root,
)


def _project(root):
    root.mkdir()
    (root / "pkg").mkdir()
    (root / "pkg" / "wf.py").write_text("print('hi')\n")
    (root / "data").mkdir()
    (root / "data" / "ignored.bin").write_bytes(b"x" * 300_000)
    (root / "weights.bin").write_bytes(b"w" * 200_000)
    (root / "notes.txt").write_text("small\n")
    (root / "__pycache__").mkdir()
    (root / "__pycache__" / "wf.cpython-311.pyc").write_bytes(b"c")
    (root / ".gitignore").write_text("data/\n")
    return root


def test_outside_git_the_gitignore_is_honoured(tmp_path):
    root = _project(tmp_path / "proj")
    assert list_files(str(root)) == [".gitignore", "notes.txt", "pkg/wf.py", "weights.bin"]
    assert project_root(str(root / "pkg" / "wf.py")) == str(root / "pkg")


def test_in_git_tracked_and_unignored_files_travel(tmp_path):
    root = _project(tmp_path / "repo")
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    subprocess.run(["git", "-C", str(root), "add", "pkg/wf.py"], check=True)
    assert project_root(str(root / "pkg" / "wf.py")) == str(root)
    assert list_files(str(root)) == [".gitignore", "notes.txt", "pkg/wf.py", "weights.bin"]


def test_the_zip_is_reproducible_and_holds_the_listed_files(tmp_path):
    root = _project(tmp_path / "proj")
    first = pack_project(str(root), str(tmp_path))
    second = pack_project(str(root), str(tmp_path))
    with open(first.zip_path, "rb") as a, open(second.zip_path, "rb") as b:
        assert a.read() == b.read()  # same bytes: Ray uploads unchanged code once
    with zipfile.ZipFile(first.zip_path) as archive:
        assert sorted(archive.namelist()) == list_files(str(root))
        assert archive.read("pkg/wf.py") == b"print('hi')\n"


def test_too_large_names_the_biggest_files(tmp_path, monkeypatch):
    root = _project(tmp_path / "proj")
    monkeypatch.setenv("UF_RAY_WORKING_DIR_MAX_MB", "0.1")
    with pytest.raises(WorkingDirTooLargeError) as caught:
        pack_project(str(root), str(tmp_path))
    message = str(caught.value)
    assert "weights.bin (195.3Ki" in message or "weights.bin (" in message
    assert "ignored.bin" not in message  # ignored files neither travel nor count
    assert "UF_RAY_WORKING_DIR_MAX_MB" in message and ".gitignore" in message
    assert not list(tmp_path.glob("uf-project-*.zip"))  # refused before anything is written


def test_bad_limit_names_the_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("UF_RAY_WORKING_DIR_MAX_MB", "lots")
    with pytest.raises(ValueError, match="UF_RAY_WORKING_DIR_MAX_MB='lots'"):
        pack_project(str(_project(tmp_path / "proj")), str(tmp_path))
