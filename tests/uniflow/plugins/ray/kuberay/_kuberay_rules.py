"""A few rules of the real KubeRay operator v1.7.0, written down small so tests can apply them.

Each function imitates one piece of the operator's Go source at tag ``ray-operator/v1.7.0``
(paths under ``ray-operator/`` in github.com/ray-project/kuberay), read there and restated
here in our own words; nothing else of the operator is imitated. They let unit tests check
what the operator will do with a manifest without running it.
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

# controllers/ray/utils/constant.go: the default port of each named head port.
DEFAULT_PORTS = {"client": 10001, "gcs-server": 6379, "dashboard": 8265, "metrics": 8080,
                 "serve": 8000}
# controllers/ray/common/pod.go, DefaultWorkerPodTemplate: the ``wait-gcs-ready`` init
# container KubeRay adds to every worker pod (ENABLE_INIT_CONTAINER_INJECTION defaults on),
# with equal requests and limits.
WAIT_GCS_READY_REQUESTS = {"cpu": Decimal("0.2"), "memory": Decimal(256 * 2**20)}
# controllers/ray/utils/constant.go: MaxRayClusterNameLength (53) - 6.
MAX_RAYSERVICE_NAME = 47


def head_service_ports(cluster: dict[str, Any]) -> list[dict[str, Any]]:
    """The ports of the head Service KubeRay creates for a RayCluster manifest.

    ``controllers/ray/common/service.go`` (``BuildServiceForHeadPod``, ``getServicePorts``,
    ``getPortsFromCluster``): the ray container's named ports (an unnamed one becomes
    ``<port>-port``), or all default ports when it declares none, plus ``metrics`` when
    missing. With a custom ``headGroupSpec.headService`` these are appended to its ports
    as they are, without removing a port of the same name or number.
    """
    head = cluster["spec"]["headGroupSpec"]
    container = head["template"]["spec"]["containers"][0]
    derived: dict[str, int] = {}
    for port in container.get("ports") or []:
        derived[port.get("name") or f"{port['containerPort']}-port"] = port["containerPort"]
    if not derived:
        derived = dict(DEFAULT_PORTS)
    derived.setdefault("metrics", DEFAULT_PORTS["metrics"])
    custom = ((head.get("headService") or {}).get("spec") or {}).get("ports") or []
    return [dict(p) for p in custom] + [{"name": name, "port": port}
                                        for name, port in derived.items()]


def service_port_problems(ports: list[dict[str, Any]]) -> list[str]:
    """What the API server's Service validation says about these ports (names and numbers).

    Kubernetes refuses a Service with two ports of one name, or two of one port number and
    protocol (``pkg/apis/core/validation``, ``ValidateService``).
    """
    out, names, numbers = [], set(), set()
    for port in ports:
        name, key = port.get("name"), (port["port"], port.get("protocol", "TCP"))
        if name in names:
            out.append(f"duplicate port name {name!r}")
        if key in numbers:
            out.append(f"duplicate port {key}")
        names.add(name)
        numbers.add(key)
    return out


def resources_map(ray_start_params: dict[str, str]) -> dict[str, float]:
    """How KubeRay reads ``rayStartParams.resources`` (``common/pod.go``, ``getResourcesMap``).

    It trims surrounding quotes (single, double, backtick) and spaces, then unmarshals the
    rest as a JSON object of numbers; anything else is an error that stops the pod's creation.
    """
    raw = ray_start_params.get("resources")
    if raw is None:
        return {}
    value = json.loads(raw.strip("'\"` "))
    if not isinstance(value, dict) or not all(
            isinstance(v, int | float) and not isinstance(v, bool) for v in value.values()):
        raise ValueError(f"resources {raw!r} is not a JSON object of numbers")
    return {str(k): float(v) for k, v in value.items()}
