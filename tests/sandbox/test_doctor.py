"""``sandbox doctor`` with all tools, one missing, one too old, and a stopped Docker engine."""

from __future__ import annotations

import re

from michelangelo.sandbox._doctor import TOOLS, missing_capabilities, parse_version
from tests.sandbox import _tool_doubles
from tests.sandbox.conftest import make_tools


def test_all_present(tools):
    result = tools.invoke("doctor")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    for name, version in [("docker", "27.3.1"), ("kind", "0.24.0"), ("kubectl", "1.31.1"),
                          ("helm", "3.16.2")]:
        line = next(line for line in lines if line.split()[1:2] == [name])
        assert line.startswith("ok") and version in line and tools.bin in line
    assert any("docker engine" in line and "27.3.1" in line for line in lines)
    assert "all set" in result.output
    assert sorted(c[:2] for c in tools.commands()) == [
        ["docker", "--version"], ["docker", "info"], ["docker", "info"], ["helm", "version"],
        ["kind", "version"], ["kubectl", "version"]]
    # the engine's setup, as its `docker info` gives it
    assert re.search(r"^ok +storage driver overlay2", result.output, re.MULTILINE)
    assert re.search(r"^ok +cgroups +systemd/v2", result.output, re.MULTILINE)


def test_one_missing_names_the_exact_install_hint(tmp_path, monkeypatch):
    tools = make_tools(tmp_path, monkeypatch,
                       tuple(t for t in _tool_doubles.TOOLS if t != "helm"))
    result = tools.invoke("doctor")
    assert result.exit_code == 1
    helm = next(spec for spec in TOOLS if spec.name == "helm")
    assert "FAIL helm" in result.output
    assert "not found on PATH (it installs the KubeRay operator chart)" in result.output
    assert f"fix: {helm.install}" in result.output
    assert "https://helm.sh/docs/intro/install/" in helm.install
    assert "all set" not in result.output
    # the others are still reported as fine
    assert sum(line.startswith("ok") for line in result.output.splitlines()) == 6


def test_too_old_version(tools):
    state = tools.state()
    state["versions"]["kind"] = "kind v0.17.0 go1.19.2 linux/amd64"
    tools.set_state(versions=state["versions"])
    result = tools.invoke("doctor")
    assert result.exit_code == 1
    assert re.search(r"^FAIL kind +0\.17\.0 ", result.output, re.MULTILINE)
    assert "version 0.17.0 is older than the 0.20.0 the sandbox needs" in result.output
    assert "fix: upgrade kind to 0.20.0 or newer: go install sigs.k8s.io/kind@" in result.output


def test_docker_engine_not_running(tools):
    tools.set_state(engine="")
    result = tools.invoke("doctor")
    assert result.exit_code == 1
    assert "FAIL docker engine" in result.output
    assert "Is the docker daemon running?" in result.output


def test_parse_version_forms():
    assert parse_version("Docker version 28.2.2, build e6534b4") == (28, 2, 2)
    assert parse_version('{"clientVersion": {"gitVersion": "v1.32.4-dispatcher"}}') \
        == (1, 32, 4)
    assert parse_version("v3.16.2+g13654a5") == (3, 16, 2)
    assert parse_version("no digits") is None


def test_build_images_needs_go_and_debootstrap_not_helm(tmp_path, monkeypatch):
    tools = make_tools(tmp_path, monkeypatch,
                       tuple(t for t in _tool_doubles.TOOLS if t not in ("helm", "kind")))
    result = tools.invoke("doctor", "--build-images")
    lines = result.output.splitlines()
    # kind and helm missing are fine in this mode: one is built, the other not used
    assert re.search(r"^ok +kind ", result.output, re.MULTILINE), result.output
    assert re.search(r"^ok +helm ", result.output, re.MULTILINE), result.output
    # Go and debootstrap are looked for (the stand-ins' PATH has neither)
    assert any(line.startswith("FAIL go ") for line in lines), result.output
    assert any(line.startswith("FAIL debootstrap") for line in lines), result.output
    assert "fix: install Go 1.26 or newer" in result.output
    assert result.exit_code == 1


def test_build_images_needs_no_debootstrap_once_the_base_image_is_there(tmp_path, monkeypatch):
    from michelangelo.sandbox._build_images import base_image_tag

    tools = make_tools(tmp_path, monkeypatch,
                       tuple(t for t in _tool_doubles.TOOLS if t not in ("helm", "kind")))
    tools.set_state(images=[*tools.state()["images"], base_image_tag()])
    result = tools.invoke("doctor", "--build-images")
    assert re.search(rf"^ok +debootstrap +not needed +{re.escape(base_image_tag())}$",
                     result.output, re.MULTILINE), result.output
    assert "FAIL go " in result.output  # Go is still needed (and still missing here)


def test_missing_capabilities_read_from_the_bounding_set():
    every = (1 << 41) - 1
    status = f"Name:\tx\nCapBnd:\t{every:016x}\n"
    assert missing_capabilities(status, 40) == []
    without = every & ~(1 << 24)
    assert missing_capabilities(f"CapBnd:\t{without:016x}\n", 40) == ["CAP_SYS_RESOURCE"]
    # capabilities past the kernel's last one are not counted as missing
    assert missing_capabilities(f"CapBnd:\t{(1 << 38) - 1:016x}\n", 37) == []
