"""Sandbox tests run the real CLI against recording stand-ins for docker, kind, kubectl, helm."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import pytest
from click.testing import CliRunner

from michelangelo.cli._main import cli
from tests.sandbox import _tool_doubles


@dataclass
class Tools:
    """The stand-ins' folder, state and record, with helpers to read and change them."""

    bin: str
    state_path: str
    record_path: str
    settings_path: str
    project: str

    def calls(self) -> list[dict]:
        return _tool_doubles.read_record(self.record_path)

    def commands(self) -> list[list[str]]:
        return [[c["tool"], *c["argv"]] for c in self.calls()]

    def forget_calls(self) -> None:
        if os.path.exists(self.record_path):
            os.unlink(self.record_path)

    def state(self) -> dict:
        with open(self.state_path) as handle:
            return json.load(handle)

    def set_state(self, **changes) -> None:
        state = self.state()
        state.update(changes)
        with open(self.state_path, "w") as handle:
            json.dump(state, handle)

    def invoke(self, *args: str):
        return CliRunner().invoke(cli, ["sandbox", *args], catch_exceptions=False)


def _project(folder: str) -> str:
    """A minimal source checkout for the image step (what 'pip install .' needs, plus junk)."""
    files = {"pyproject.toml": "[project]\nname = 'michelangelo'\n",
             "constraints.txt": "ray==2.60.0\n", "README.md": "# m\n",
             "michelangelo/__init__.py": "", "michelangelo/sandbox/Dockerfile": "FROM x\n",
             "michelangelo/__pycache__/x.cpython-311.pyc": "",
             ".venv/lib/big.bin": "not for the image", "data/rows.parquet": "no"}
    for rel, text in files.items():
        path = os.path.join(folder, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as handle:
            handle.write(text)
    return folder


def make_tools(root, monkeypatch, tools=_tool_doubles.TOOLS) -> Tools:
    root = str(root)
    found = Tools(os.path.join(root, "bin"), os.path.join(root, "state.json"),
                  os.path.join(root, "record.jsonl"), os.path.join(root, "home", "sandbox.json"),
                  _project(os.path.join(root, "project")))
    _tool_doubles.install(found.bin, found.state_path, found.record_path, tools)
    # The stand-ins alone on PATH: the machine's own docker or kubectl must never be reached.
    monkeypatch.setenv("PATH", found.bin)
    monkeypatch.setenv("HOME", os.path.join(root, "home"))
    monkeypatch.setenv("MA_SANDBOX_FILE", found.settings_path)
    # No cache of built tools either (create --build-images leaves kind and kubectl there).
    monkeypatch.delenv("MICHELANGELO_CACHE", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    return found


@pytest.fixture
def tools(tmp_path, monkeypatch) -> Tools:
    return make_tools(tmp_path, monkeypatch)


@pytest.fixture(scope="session")
def first_create(tmp_path_factory):
    """One ``sandbox create`` on a fresh machine: its result, calls and the state it left."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        tools = make_tools(tmp_path_factory.mktemp("create"), monkeypatch)
        result = tools.invoke("create", "--project-dir", tools.project)
        assert result.exit_code == 0, result.output
        with open(tools.state_path) as handle:
            state = handle.read()
        with open(tools.settings_path) as handle:
            settings = handle.read()
        mode = os.stat(tools.settings_path).st_mode & 0o777
        found = {"tools": tools, "result": result, "calls": tools.calls(), "state": state,
                 "settings": settings, "mode": mode}
    # Returned after PATH and HOME are put back: the stand-ins must not stay on PATH for the
    # rest of the session (a later `ray start` would find no bash).
    return found


@pytest.fixture
def created(tools, first_create) -> Tools:
    """Fresh stand-ins whose machine state is the one the first create left."""
    with open(tools.state_path, "w") as handle:
        handle.write(first_create["state"])
    os.makedirs(os.path.dirname(tools.settings_path), exist_ok=True)
    with open(tools.settings_path, "w") as handle:
        handle.write(first_create["settings"])
    os.chmod(tools.settings_path, 0o600)
    return tools
