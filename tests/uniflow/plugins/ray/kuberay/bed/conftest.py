"""One real control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler) and
the real KubeRay operator for the KubeRay tests, with two Node objects served by the kubelet
double. The bed itself is a tool of the project's, ``tools/kuberay_bed`` (see its README)."""

from __future__ import annotations

import pytest

from michelangelo.uniflow.plugins.ray.kuberay._kube import KubeApi, KubeTarget
from tools.kuberay_bed import NODES, ControlPlane, KubeletDouble, build, build_operator


@pytest.fixture(scope="session")
def control_plane():
    plane = ControlPlane(build(), build_operator()).start()
    try:
        for name, amounts in NODES.items():
            plane.add_node(name, **amounts)
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="session")
def kube_cluster(control_plane):
    """The plane (with the real operator) and the kubelet double; yields (plane, kubelet)."""
    kubelet = KubeletDouble(control_plane.api_client(), list(NODES),
                            net_file=control_plane.net_file).start()
    try:
        yield control_plane, kubelet
    finally:
        kubelet.stop()


@pytest.fixture(autouse=True)
def _kubeconfig(control_plane, monkeypatch):
    """Each test (and what it starts in-process) reaches the plane through KUBECONFIG."""
    monkeypatch.setenv("KUBECONFIG", str(control_plane.kubeconfig))


@pytest.fixture(scope="module")
def api(kube_cluster):
    """The SDK's Kubernetes client, pointed at the bed's API server."""
    plane, _ = kube_cluster
    return KubeApi(KubeTarget(kubeconfig=str(plane.kubeconfig)))
