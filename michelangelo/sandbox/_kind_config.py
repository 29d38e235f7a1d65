"""The kind cluster configuration: one node whose service ports reach ``127.0.0.1``.

kind forwards a host port to a port of the node container; a Kubernetes Service of type
NodePort with that node port then answers on the host. Binding to ``127.0.0.1`` keeps the Ray
dashboard (which runs jobs) and MinIO off the network.
"""

from __future__ import annotations

from typing import Any

from michelangelo.sandbox._settings import HOST_PORTS

NODE_IMAGE_STORE = "/var/lib/containerd"  # the node's containerd root: its images' content


def kind_config(host_ports: dict[str, tuple[int, int]] | None = None, *,
                cgroup_v1: bool = False, image_store: str | None = None) -> dict[str, Any]:
    """A ``kind.x-k8s.io/v1alpha4`` Cluster with the port mappings the sandbox uses.

    Args:
        host_ports: ``name -> (host port, node port)``; defaults to the sandbox's
            (Ray dashboard 8265, Serve 8000, MinIO 9000 and console 9001).
        cgroup_v1: The Docker engine runs on cgroup v1; the kubelet then needs
            ``failCgroupV1: false`` (since Kubernetes 1.35 it refuses v1 by default).
        image_store: A folder of this machine mounted as the node's containerd root, so that
            the images unpacked into one cluster's node are there for the next one.

    Returns:
        The configuration as a dict; written as JSON, which kind reads as YAML.
    """
    ports = HOST_PORTS if host_ports is None else host_ports
    mappings = [{"containerPort": node, "hostPort": host, "listenAddress": "127.0.0.1",
                 "protocol": "TCP"} for host, node in ports.values()]
    node: dict[str, Any] = {"role": "control-plane", "extraPortMappings": mappings}
    if image_store is not None:
        node["extraMounts"] = [{"hostPath": image_store, "containerPath": NODE_IMAGE_STORE}]
    config: dict[str, Any] = {
        "kind": "Cluster",
        "apiVersion": "kind.x-k8s.io/v1alpha4",
        "nodes": [node],
    }
    if cgroup_v1:
        config["kubeadmConfigPatches"] = [
            "kind: KubeletConfiguration\nfailCgroupV1: false\n"]
    return config
