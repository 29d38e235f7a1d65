"""``sandbox delete``: the kind cluster and the settings file go, the image stays."""

from __future__ import annotations

import os


def test_delete_then_delete_again(created):
    tools = created
    image = tools.state()["images"][0]
    tools.forget_calls()

    result = tools.invoke("delete")
    assert result.exit_code == 0, result.output
    assert tools.commands() == [
        ["kind", "get", "clusters"], ["kind", "delete", "cluster", "--name", "michelangelo"],
        ["kind", "get", "clusters"],
        ["docker", "network", "inspect", "kind", "--format", "{{len .Containers}}"],
        ["docker", "network", "rm", "kind"]]
    assert "deleting kind cluster 'michelangelo'" in result.output
    assert "removed Docker network 'kind'" in result.output
    assert f"removed {tools.settings_path}" in result.output
    assert not os.path.exists(tools.settings_path)
    state = tools.state()
    assert state["clusters"] == [] and state["releases"] == {} and state["objects"] == {}
    assert state["images"] == [image] and state["networks"] == []

    tools.forget_calls()
    result = tools.invoke("delete")
    assert result.exit_code == 0
    assert "nothing to delete" in result.output
    assert tools.commands() == [
        ["kind", "get", "clusters"], ["kind", "get", "clusters"],
        ["docker", "network", "inspect", "kind", "--format", "{{len .Containers}}"]]


def test_delete_keeps_the_kind_network_while_another_kind_cluster_uses_it(created):
    tools = created
    tools.set_state(clusters=[*tools.state()["clusters"], "theirs"])
    tools.forget_calls()

    result = tools.invoke("delete")
    assert result.exit_code == 0, result.output
    assert tools.commands()[-1] == ["kind", "get", "clusters"]  # 'theirs' is left: no removal
    assert "Docker network" not in result.output
    assert tools.state()["networks"] == ["kind"] and tools.state()["clusters"] == ["theirs"]
