"""The KubeRay operator's own objects when no helm chart can be fetched (``--build-images``).

The CRDs and the operator's ClusterRole come from the release's source (``config/crd/bases``
and ``config/rbac/role.yaml``), applied as they are. What the chart would add around them is
here: the namespace, the operator's service account, the binding of that role to it, and the
Deployment running the locally built image, shaped as the chart's defaults (one replica,
non-root, read-only root file system, probes on the metrics port).
"""

from __future__ import annotations

from typing import Any

OPERATOR_NAME = "kuberay-operator"
_LABELS = {"app.kubernetes.io/name": "kuberay", "app.kubernetes.io/component": OPERATOR_NAME,
           "app.kubernetes.io/managed-by": "michelangelo-sandbox"}


def operator_manifests(namespace: str, image: str) -> dict[str, Any]:
    """The namespace, service account, role binding and Deployment, as one ``v1`` ``List``."""
    probe = {"httpGet": {"path": "/metrics", "port": "http"}, "initialDelaySeconds": 5,
             "periodSeconds": 5, "failureThreshold": 5}
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": OPERATOR_NAME, "namespace": namespace, "labels": dict(_LABELS)},
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": {k: _LABELS[k] for k in list(_LABELS)[:2]}},
            "template": {
                "metadata": {"labels": dict(_LABELS)},
                "spec": {
                    "serviceAccountName": OPERATOR_NAME,
                    "securityContext": {"runAsNonRoot": True,
                                        "seccompProfile": {"type": "RuntimeDefault"}},
                    "terminationGracePeriodSeconds": 10,
                    "containers": [{
                        "name": OPERATOR_NAME,
                        "image": image,
                        "imagePullPolicy": "IfNotPresent",
                        "command": ["/usr/local/bin/kuberay-operator"],
                        "ports": [{"name": "http", "containerPort": 8080}],
                        "securityContext": {"allowPrivilegeEscalation": False,
                                            "readOnlyRootFilesystem": True,
                                            "capabilities": {"drop": ["ALL"]}},
                        "livenessProbe": probe,
                        "readinessProbe": probe,
                        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"},
                                      "limits": {"memory": "512Mi"}},
                    }],
                },
            },
        },
    }
    return {"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": OPERATOR_NAME, "namespace": namespace, "labels": dict(_LABELS)}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": OPERATOR_NAME, "labels": dict(_LABELS)},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": OPERATOR_NAME},
         "subjects": [{"kind": "ServiceAccount", "name": OPERATOR_NAME,
                       "namespace": namespace}]},
        deployment,
    ]}
