"""The sandbox settings file that ``remote-run --kuberay --sandbox`` reads.

``sandbox create`` writes it (default ``~/.michelangelo/sandbox.json``, or ``$MA_SANDBOX_FILE``)
with mode 0600 because it holds the MinIO credentials the driver needs to read and write the
sandbox's storage from this machine. Pods get the same credentials from the Kubernetes Secret
named here, never from the file. The credentials are left out of every ``repr`` and message.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from michelangelo.sandbox._errors import SandboxError

SETTINGS_ENV = "MA_SANDBOX_FILE"
CLUSTER_NAME = "michelangelo"
KUBE_CONTEXT = f"kind-{CLUSTER_NAME}"
NAMESPACE = "michelangelo"
KUBERAY_NAMESPACE = "kuberay-system"
KUBERAY_VERSION = "1.7.0"
BUCKET = "michelangelo"
STORAGE_SECRET = "michelangelo-storage"
MINIO_SERVICE = "minio"
# Host port -> kind node port. The node ports are what Services of type NodePort name.
HOST_PORTS = {"dashboard": (8265, 30265), "serve": (8000, 30800),
              "s3": (9000, 30900), "s3_console": (9001, 30901)}
# The sandbox's one node shares this machine's CPUs: each Ray pod requests a tenth of the CPUs
# its RayTask declares (limits and Ray's own CPU count stay as declared), so that the
# quickstart's 5-CPU shape fits a 2-core machine next to the control plane.
CPU_REQUEST_FRACTION = 0.1


def cache_root() -> Path:
    """Where builds are kept, once per version."""
    explicit = os.environ.get("MICHELANGELO_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "michelangelo"


def settings_path() -> str:
    """Where the settings file lives."""
    return os.environ.get(SETTINGS_ENV) or os.path.join(
        os.path.expanduser("~"), ".michelangelo", "sandbox.json")


@dataclass(frozen=True)
class SandboxSettings:
    """What a KubeRay run needs to use the sandbox.

    Attributes:
        kube_context: kubeconfig context of the kind cluster (``kind-michelangelo``).
        namespace: Namespace for RayClusters; the storage Secret lives there.
        image: Runtime image loaded into kind (Ray 2.60 plus this project).
        storage_url: uniflow storage root, ``s3://<bucket>/uniflow``.
        s3_endpoint: MinIO as this machine reaches it (``http://127.0.0.1:9000``).
        s3_endpoint_in_cluster: MinIO as pods reach it.
        storage_secret: Name of the Secret whose keys (``AWS_ACCESS_KEY_ID``,
            ``AWS_SECRET_ACCESS_KEY``, ``AWS_ENDPOINT_URL``, ...) become environment variables
            of every Ray node; pass it as ``ray_cluster_manifest(..., storage_secret=...)``.
        node_ports: Node port of each service kind maps to ``127.0.0.1``, by name
            (``dashboard``, ``serve``, ``s3``, ``s3_console``).
        cpu_request_fraction: The share of each Ray node's CPUs its pod requests from the
            sandbox's Kubernetes (``CPU_REQUEST_FRACTION`` for sandboxes made now; 1, every
            CPU, in settings written before it existed).
        access_key: MinIO access key (for the driver; never shown).
        secret_key: MinIO secret key (for the driver; never shown).
    """

    kube_context: str
    namespace: str
    image: str
    storage_url: str
    s3_endpoint: str
    s3_endpoint_in_cluster: str
    storage_secret: str
    node_ports: dict[str, int] = field(default_factory=dict)
    cpu_request_fraction: float = 1.0
    access_key: str = field(default="", repr=False)
    secret_key: str = field(default="", repr=False)

    def storage_options(self) -> dict[str, Any]:
        """fsspec/s3fs options that reach the sandbox's MinIO from this machine."""
        return {"key": self.access_key, "secret": self.secret_key,
                "client_kwargs": {"endpoint_url": self.s3_endpoint}}

    def client_environment(self) -> dict[str, str]:
        """Environment variables that point s3fs/botocore in this process at the sandbox."""
        return {"AWS_ACCESS_KEY_ID": self.access_key,
                "AWS_SECRET_ACCESS_KEY": self.secret_key,
                "AWS_ENDPOINT_URL": self.s3_endpoint,
                "FSSPEC_S3_ENDPOINT_URL": self.s3_endpoint}

    def use_client_environment(self) -> None:
        """Point this process's s3fs/botocore at the sandbox; what is set already wins."""
        for key, value in self.client_environment().items():
            os.environ.setdefault(key, value)


def load_sandbox_settings(path: str | None = None) -> SandboxSettings:
    """Read the settings ``sandbox create`` wrote.

    Args:
        path: The file (defaults to ``$MA_SANDBOX_FILE`` or ``~/.michelangelo/sandbox.json``).

    Returns:
        The sandbox's settings.

    Raises:
        SandboxError: There is no sandbox yet, or the file is damaged.
    """
    path = path or settings_path()
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except FileNotFoundError:
        raise SandboxError(f"no sandbox settings at {path}: run 'michelangelo sandbox create' "
                           "first.") from None
    except ValueError as exc:
        raise SandboxError(f"sandbox settings at {path} are not valid JSON ({exc}); run "
                           "'michelangelo sandbox create' again to rewrite them.") from None
    known = set(SandboxSettings.__dataclass_fields__)
    missing = {"kube_context", "namespace", "image", "storage_url", "s3_endpoint",
               "s3_endpoint_in_cluster", "storage_secret"} - set(data)
    if missing:
        raise SandboxError(f"sandbox settings at {path} lack {sorted(missing)}; run "
                           "'michelangelo sandbox create' again to rewrite them.")
    return SandboxSettings(**{k: v for k, v in data.items() if k in known})


def write_sandbox_settings(settings: SandboxSettings, path: str | None = None) -> str:
    """Write the settings atomically, readable by this user only (0600); returns the path."""
    path = path or settings_path()
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    # Created 0600 from the start, so the credentials are never readable by others, even
    # for a moment; the rename makes the new file appear whole.
    fd, tmp = tempfile.mkstemp(prefix=".sandbox-", suffix=".json", dir=folder)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(asdict(settings), handle, indent=2, sort_keys=True)
            handle.write("\n")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path

