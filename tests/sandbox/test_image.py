"""The runtime image plan: a tag that follows the project's content, and a small context."""

from __future__ import annotations

import os

import pytest

from michelangelo.sandbox import SandboxError
from michelangelo.sandbox._image import find_project_root, plan_image, write_context
from tests.sandbox.conftest import _project


def test_tag_follows_content(tmp_path):
    root = _project(str(tmp_path / "p"))
    first = plan_image(root)
    assert plan_image(root) == first
    # files outside the context (virtualenv, data, bytecode) do not change the tag
    with open(os.path.join(root, ".venv", "lib", "big.bin"), "w") as handle:
        handle.write("changed")
    assert plan_image(root).tag == first.tag
    with open(os.path.join(root, "michelangelo", "__init__.py"), "w") as handle:
        handle.write("VERSION = 2\n")
    assert plan_image(root).tag != first.tag


def test_context_and_missing_checkout(tmp_path):
    root = _project(str(tmp_path / "p"))
    out = tmp_path / "ctx"
    dockerfile = write_context(root, str(out))
    assert dockerfile == str(out / "Dockerfile")
    assert sorted(os.listdir(out)) == ["Dockerfile", "README.md", "constraints.txt",
                                       "michelangelo", "pyproject.toml"]
    with pytest.raises(SandboxError, match="no pyproject.toml and constraints.txt in .*--project-dir"):
        find_project_root(str(tmp_path))
    # this checkout is found from the installed package
    assert os.path.isfile(os.path.join(find_project_root(), "michelangelo", "sandbox",
                                       "Dockerfile"))
