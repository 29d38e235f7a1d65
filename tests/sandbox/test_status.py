"""``sandbox status`` before, during and after a sandbox exists."""

from __future__ import annotations

import json


def test_status_without_sandbox(tools):
    result = tools.invoke("status")
    assert result.exit_code == 1
    assert "kind cluster     'michelangelo' does not exist; run 'michelangelo sandbox create'" \
        in result.output
    assert f"settings         {tools.settings_path} is missing" in result.output
    assert tools.commands() == [["kind", "get", "clusters"]]


def test_status_of_a_created_sandbox(created):
    tools = created
    with open(tools.settings_path) as handle:
        settings = json.load(handle)
    state = tools.state()
    state["objects"]["RayCluster/michelangelo/uf-train-abc123"] = {
        "kind": "RayCluster", "metadata": {"name": "uf-train-abc123"}}
    tools.set_state(objects=state["objects"])
    tools.forget_calls()

    result = tools.invoke("status")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert [line.split()[0] for line in lines] == ["ok"] * 7
    assert "KubeRay operator 1/1 ready" in result.output
    assert "MinIO            1/1 ready" in result.output
    assert "bucket           created" in result.output
    assert f"runtime image    {settings['image']}" in result.output
    assert "RayClusters      1 in 'michelangelo': uf-train-abc123" in result.output
    assert "storage s3://michelangelo/uniflow via http://127.0.0.1:9000" in result.output
    assert settings["secret_key"] not in result.output
    assert all(c[0] != "kubectl" or c[1:3] == ["--context", "kind-michelangelo"]
               for c in tools.commands())

    # the image gone from Docker (e.g. 'docker image prune'): status says so and fails
    tools.set_state(images=[])
    result = tools.invoke("status")
    assert result.exit_code == 1
    assert f"{settings['image']} is not in Docker; run 'michelangelo sandbox create'" \
        in result.output
