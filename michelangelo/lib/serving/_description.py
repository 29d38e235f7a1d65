"""What a deployment is, as a plain value: model, replicas, batching, route.

The local path hands it to Ray Serve as the application's argument; a KubeRay ``RayService``
can render the same value into its ``serveConfigV2`` (see :meth:`DeploymentDescription.to_serve_config`),
because the endpoint is built from it alone by :func:`michelangelo.lib.serving._app.build_app`.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from michelangelo.errors import InputError

_NAME = re.compile(r"^[a-z0-9]([a-z0-9_-]{0,61}[a-z0-9])?$")
MIB = 2**20


@dataclasses.dataclass(frozen=True)
class DeploymentDescription:
    """Everything needed to stand up one endpoint, validated at construction.

    Args:
        name: Deployment (and Serve application) name; also the OIP model name.
        project_name: Registry project of the served revision.
        model_name: Registry model of the served revision.
        revision_id: The resolved revision number (never an alias: aliases move).
        weights_sha256: The revision's recorded weights digest, checked by each replica.
        registry_url: fsspec URL of the registry, reachable from every replica.
        num_replicas: Replicas behind the route.
        max_batch_size: Most ROWS one forward pass takes; ``None`` turns batching off.
        batch_wait_timeout_s: How long a batch waits for more rows after its first request.
        max_request_bytes: Bodies above this get 413.
        replica_cpus: Logical CPUs each replica reserves.
        host: Address the HTTP proxy binds.
        port: Port the HTTP proxy binds.
    """

    name: str
    project_name: str
    model_name: str
    revision_id: int
    weights_sha256: str
    registry_url: str | None = None
    num_replicas: int = 1
    max_batch_size: int | None = 32
    batch_wait_timeout_s: float = 0.005
    max_request_bytes: int = 8 * MIB
    replica_cpus: float = 0.5
    host: str = "127.0.0.1"
    port: int = 8000

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise InputError(
                f"deployment name={self.name!r} is not valid: use 1-63 lowercase letters, digits, "
                "'-' or '_', starting and ending with a letter or digit (it becomes a URL path "
                "and a Kubernetes-friendly name). Fix: e.g. name='churn-model'.")
        if self.name == "v2":
            raise InputError("deployment name='v2' is taken: /v2 is where the Open Inference "
                             "Protocol answers for every deployment. Fix: choose another name.")
        _check_int("num_replicas", self.num_replicas, 1)
        if self.max_batch_size is not None:
            _check_int("max_batch_size", self.max_batch_size, 1)
        if not isinstance(self.batch_wait_timeout_s, int | float) or not (
                0 <= self.batch_wait_timeout_s <= 60):
            raise InputError(f"batch_wait_timeout_s={self.batch_wait_timeout_s!r} must be a "
                             "number of seconds between 0 and 60. Fix: e.g. 0.005.")
        _check_int("max_request_bytes", self.max_request_bytes, 1024)
        if not isinstance(self.replica_cpus, int | float) or self.replica_cpus < 0:
            raise InputError(f"replica_cpus={self.replica_cpus!r} must be a number >= 0.")
        _check_int("port", self.port, 1)
        if self.port > 65535:
            raise InputError(f"port={self.port!r} must be at most 65535.")
        if not isinstance(self.host, str) or not self.host:
            raise InputError(f"host={self.host!r} must be an address such as '127.0.0.1'.")

    @property
    def route_prefix(self) -> str:
        return f"/{self.name}"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DeploymentDescription:
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in fields})

    def to_serve_config(self) -> dict[str, Any]:
        """A Ray Serve config (the ``serveConfigV2`` of a RayService) for this endpoint.

        Its first application is the endpoint; the second answers the Open Inference
        Protocol at the server's root (``/v2/...``).
        """
        from michelangelo.lib.serving._gateway import serve_config_entry

        return {
            "proxy_location": "HeadOnly",
            "http_options": {"host": self.host, "port": self.port},
            "applications": [{
                "name": self.name,
                "route_prefix": self.route_prefix,
                "import_path": "michelangelo.lib.serving._app:build_app",
                "args": {"description": self.to_dict()},
            }, serve_config_entry()],
        }


# Resolved from the registry (and the name from the model), not chosen by a caller.
_RESOLVED = ("name", "project_name", "model_name", "revision_id", "weights_sha256",
             "registry_url")


def endpoint_options() -> dict[str, Any]:
    """The endpoint settings a caller chooses (``deploy``'s options), with their defaults.

    The one place they are defined is :class:`DeploymentDescription`; ``deploy`` takes these
    keywords and the CLI and the docs read them from here.
    """
    return {f.name: f.default for f in dataclasses.fields(DeploymentDescription)
            if f.name not in _RESOLVED}


def _check_int(field: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InputError(f"{field}={value!r} must be an integer >= {minimum}.")
