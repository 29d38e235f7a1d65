"""MinIO in the sandbox: Namespace, credentials Secret, Deployment, NodePort Service, bucket Job.

The Secret's keys are named the way boto3/s3fs read them, because KubeRay passes a Secret's
keys to every Ray node as environment variables (``envFrom``): tasks then reach the bucket with
no configuration of their own. The same keys feed MinIO's root user, so there is one source.
"""

from __future__ import annotations

import base64
import secrets
from typing import Any

from michelangelo.sandbox._settings import BUCKET, HOST_PORTS, MINIO_SERVICE, STORAGE_SECRET

MINIO_IMAGE = "quay.io/minio/minio:RELEASE.2025-09-07T16-13-09Z"
MC_IMAGE = "quay.io/minio/mc:RELEASE.2025-08-13T08-35-41Z"
BUCKET_JOB = "minio-make-bucket"
_LABELS = {"app.kubernetes.io/name": "minio", "app.kubernetes.io/part-of": "michelangelo-sandbox"}


def new_credentials() -> tuple[str, str]:
    """A fresh MinIO access key and secret key."""
    return "ma-" + secrets.token_hex(8), secrets.token_urlsafe(30)


def credentials_from_secret(secret: dict[str, Any]) -> tuple[str, str] | None:
    """The access and secret key held by an existing Secret, if it holds both."""
    data = secret.get("data") or {}
    try:
        key = base64.b64decode(data["AWS_ACCESS_KEY_ID"]).decode()
        value = base64.b64decode(data["AWS_SECRET_ACCESS_KEY"]).decode()
    except (KeyError, ValueError):
        return None
    return (key, value) if key and value else None


def in_cluster_endpoint(namespace: str) -> str:
    """MinIO's S3 address as pods reach it."""
    return f"http://{MINIO_SERVICE}.{namespace}.svc.cluster.local:9000"


def storage_manifests(namespace: str, access_key: str, secret_key: str, *,
                      minio_image: str = MINIO_IMAGE, mc_image: str = MC_IMAGE) -> dict[str, Any]:
    """Everything MinIO needs, as one ``v1`` ``List`` for ``kubectl apply -f -``."""
    endpoint = in_cluster_endpoint(namespace)
    secret = {
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": STORAGE_SECRET, "namespace": namespace, "labels": dict(_LABELS)},
        "type": "Opaque",
        # data, not stringData: kubectl keeps stringData in its last-applied annotation while
        # the live Secret holds data only, so every apply of it reported "configured".
        "data": {key: base64.b64encode(value.encode()).decode() for key, value in {
            "AWS_ACCESS_KEY_ID": access_key,
            "AWS_SECRET_ACCESS_KEY": secret_key,
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_REGION": "us-east-1",
            "FSSPEC_S3_ENDPOINT_URL": endpoint,
        }.items()},
    }
    root_env = [
        {"name": "MINIO_ROOT_USER", "valueFrom": {"secretKeyRef": {
            "name": STORAGE_SECRET, "key": "AWS_ACCESS_KEY_ID"}}},
        {"name": "MINIO_ROOT_PASSWORD", "valueFrom": {"secretKeyRef": {
            "name": STORAGE_SECRET, "key": "AWS_SECRET_ACCESS_KEY"}}},
    ]
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": MINIO_SERVICE, "namespace": namespace, "labels": dict(_LABELS)},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app.kubernetes.io/name": "minio"}},
            # One pod owns the data folder: never two at once during an update.
            "strategy": {"type": "Recreate"},
            "template": {
                "metadata": {"labels": dict(_LABELS)},
                "spec": {"containers": [{
                    "name": "minio",
                    "image": minio_image,
                    "args": ["server", "/data", "--console-address", ":9001"],
                    "env": root_env,
                    "ports": [{"name": "s3", "containerPort": 9000},
                              {"name": "console", "containerPort": 9001}],
                    "readinessProbe": {"httpGet": {"path": "/minio/health/ready", "port": 9000},
                                       "periodSeconds": 2},
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                }],
                    "volumes": [{"name": "data", "emptyDir": {}}]},
            },
        },
    }
    service = {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": MINIO_SERVICE, "namespace": namespace, "labels": dict(_LABELS)},
        "spec": {
            "type": "NodePort",
            "selector": {"app.kubernetes.io/name": "minio"},
            "ports": [
                {"name": "s3", "port": 9000, "targetPort": 9000,
                 "nodePort": HOST_PORTS["s3"][1]},
                {"name": "console", "port": 9001, "targetPort": 9001,
                 "nodePort": HOST_PORTS["s3_console"][1]},
            ],
        },
    }
    job = {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": BUCKET_JOB, "namespace": namespace, "labels": dict(_LABELS)},
        "spec": {
            "backoffLimit": 10,
            "template": {"spec": {
                "restartPolicy": "OnFailure",
                "containers": [{
                    "name": "mc",
                    "image": mc_image,
                    "env": root_env,
                    # mc reads the alias from MC_HOST_<name>; built in the shell so that the
                    # credentials stay in the Secret and out of the Job's spec.
                    "command": ["/bin/sh", "-c",
                                "export MC_HOST_sandbox=\"http://${MINIO_ROOT_USER}:"
                                "${MINIO_ROOT_PASSWORD}@" + f"{MINIO_SERVICE}:9000\" && "
                                f"mc mb --ignore-existing sandbox/{BUCKET}"],
                }],
            }},
        },
    }
    namespace_obj = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
    return {"apiVersion": "v1", "kind": "List",
            "items": [namespace_obj, secret, deployment, service, job]}
