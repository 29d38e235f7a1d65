"""One real control plane (etcd, kube-apiserver, kube-scheduler) for the KubeRay tests,
with two Node objects served by the kubelet double and the KubeRay operator double."""

from __future__ import annotations

import pytest

from tests.uniflow.plugins.ray.kuberay.bed._control_plane import ControlPlane, build
from tests.uniflow.plugins.ray.kuberay.bed._kubelet_double import KubeletDouble
from tests.uniflow.plugins.ray.kuberay.bed._operator_double import OperatorDouble

NODES = {"node-a": {"cpu": "4", "memory": "8Gi"}, "node-b": {"cpu": "2", "memory": "4Gi"}}


@pytest.fixture(scope="session")
def control_plane():
    plane = ControlPlane(build()).start()
    try:
        for name, amounts in NODES.items():
            plane.add_node(name, **amounts)
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="session")
def kube_cluster(control_plane):
    """The plane with its doubles running; yields (plane, operator, kubelet)."""
    api_client = control_plane.api_client()
    operator = OperatorDouble(api_client).start()
    kubelet = KubeletDouble(api_client, list(NODES)).start()
    try:
        yield control_plane, operator, kubelet
    finally:
        kubelet.stop()
        operator.stop()


@pytest.fixture(autouse=True)
def _kubeconfig(control_plane, monkeypatch):
    """Each test (and what it starts in-process) reaches the plane through KUBECONFIG."""
    monkeypatch.setenv("KUBECONFIG", str(control_plane.kubeconfig))
