"""The project's Kubernetes test bed: a real control plane on loopback (etcd, kube-apiserver,
kube-controller-manager, kube-scheduler) with the real KubeRay operator, and test doubles for
what needs a container runtime (the kubelet, the pod network, cluster DNS). See README.md.

The KubeRay tests (``tests/uniflow/plugins/ray/kuberay/bed/conftest.py``), ``bench/bench_kuberay.py``
and ``make k8s-up`` (``python -m tools.kuberay_bed up``) start it through these names.
"""

from tools.kuberay_bed._control_plane import (
    DEVELOPER_CONTEXT,
    NODES,
    ControlPlane,
    build,
    build_operator,
    operator_version,
)
from tools.kuberay_bed._kubelet_double import KubeletDouble, PodRecord, pod_status

__all__ = [
    "DEVELOPER_CONTEXT",
    "NODES",
    "ControlPlane",
    "KubeletDouble",
    "PodRecord",
    "build",
    "build_operator",
    "operator_version",
    "pod_status",
]
