"""``sandbox status``: what of the sandbox exists and answers, one line per part."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from michelangelo.sandbox._commands import run
from michelangelo.sandbox._errors import SandboxError
from michelangelo.sandbox._settings import (
    CLUSTER_NAME,
    KUBE_CONTEXT,
    KUBERAY_NAMESPACE,
    NAMESPACE,
    load_sandbox_settings,
    settings_path,
)
from michelangelo.sandbox._storage import BUCKET_JOB, MINIO_SERVICE


@dataclass(frozen=True)
class Part:
    """One part of the sandbox and whether it is ready."""

    name: str
    ok: bool
    detail: str


def sandbox_status() -> list[Part]:
    """Look at the kind cluster, the operator, MinIO, the bucket, the image and the settings."""
    clusters = run(("kind", "get", "clusters")).stdout.split()
    if CLUSTER_NAME not in clusters:
        parts = [Part("kind cluster", False, f"'{CLUSTER_NAME}' does not exist; run "
                      "'michelangelo sandbox create'")]
        return parts + [_settings_part()]
    kubectl = ("kubectl", "--context", KUBE_CONTEXT)
    parts = [Part("kind cluster", True, f"'{CLUSTER_NAME}' (context {KUBE_CONTEXT})")]
    parts.append(_deployment(kubectl, KUBERAY_NAMESPACE, "kuberay-operator", "KubeRay operator"))
    parts.append(_deployment(kubectl, NAMESPACE, MINIO_SERVICE, "MinIO"))
    parts.append(_bucket_job(kubectl))
    settings = _settings_part()
    if settings.ok:
        image = load_sandbox_settings().image
        found = run(("docker", "image", "inspect", image), check=False).returncode == 0
        parts.append(Part("runtime image", found, image if found else
                          f"{image} is not in Docker; run 'michelangelo sandbox create'"))
    parts.append(_ray_clusters(kubectl))
    parts.append(settings)
    return parts


def _deployment(kubectl: tuple[str, ...], namespace: str, name: str, title: str) -> Part:
    done = run((*kubectl, "--namespace", namespace, "get", "deployment", name, "--output",
                "json", "--ignore-not-found"))
    if not done.stdout.strip():
        return Part(title, False, f"deployment {namespace}/{name} is missing")
    status = json.loads(done.stdout).get("status") or {}
    ready, wanted = status.get("readyReplicas", 0), status.get("replicas", 0)
    return Part(title, wanted > 0 and ready >= wanted, f"{ready}/{wanted} ready")


def _bucket_job(kubectl: tuple[str, ...]) -> Part:
    done = run((*kubectl, "--namespace", NAMESPACE, "get", "job", BUCKET_JOB, "--output",
                "json", "--ignore-not-found"))
    if not done.stdout.strip():
        return Part("bucket", False, f"job {NAMESPACE}/{BUCKET_JOB} is missing")
    succeeded = (json.loads(done.stdout).get("status") or {}).get("succeeded", 0)
    return Part("bucket", succeeded > 0, "created" if succeeded else "job not finished")


def _ray_clusters(kubectl: tuple[str, ...]) -> Part:
    done = run((*kubectl, "--namespace", NAMESPACE, "get", "rayclusters", "--output", "json"),
               check=False)
    if done.returncode != 0:
        return Part("RayClusters", False, "the RayCluster kind is unknown (operator missing?)")
    names = [item["metadata"]["name"] for item in json.loads(done.stdout).get("items", [])]
    return Part("RayClusters", True, f"{len(names)} in '{NAMESPACE}'"
                + (f": {', '.join(names)}" if names else ""))


def _settings_part() -> Part:
    path = settings_path()
    if not os.path.exists(path):
        return Part("settings", False, f"{path} is missing")
    try:
        settings = load_sandbox_settings(path)
    except SandboxError as exc:
        return Part("settings", False, str(exc))
    return Part("settings", True, f"{path}: storage {settings.storage_url} via "
                f"{settings.s3_endpoint}, Secret '{settings.storage_secret}'")
