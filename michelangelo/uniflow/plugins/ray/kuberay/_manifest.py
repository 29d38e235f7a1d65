"""Render a ``RayTask`` as a KubeRay ``ray.io/v1`` ``RayCluster``.

Every RayTask field reaches the cluster twice: as the container's requests and limits (so the
Kubernetes scheduler reserves it) and as the resources the Ray node advertises through
``rayStartParams`` (so Ray schedules on it). Both come from the same ``NodeResources`` the
local provisioner uses for its ``ray start`` flags.
"""

from __future__ import annotations

import json
import re
import sys
import time
from decimal import Decimal
from typing import Any

from michelangelo.errors import InputError
from michelangelo.uniflow.plugins.ray.kuberay._fit import WAIT_GCS_READY
from michelangelo.uniflow.plugins.ray.provisioning import NodeResources, RayTask, node_resources

LABEL_PREFIX = "uniflow.michelangelo.ai"
RUN_LABEL = f"{LABEL_PREFIX}/run-id"
TASK_LABEL = f"{LABEL_PREFIX}/task"
MANAGED_LABEL = f"{LABEL_PREFIX}/managed-by"
EXPIRES_ANNOTATION = f"{LABEL_PREFIX}/expires-at"
RUNTIME_ENV_ANNOTATION = f"{LABEL_PREFIX}/runtime-env"
WORKER_GROUP = "workers"
DEFAULT_TTL_S = 24 * 3600

# Ports a Ray head serves (KubeRay names them so its head Service exposes them).
HEAD_PORTS = {"gcs": 6379, "dashboard": 8265, "client": 10001, "serve": 8000}
# The metrics port KubeRay gives every Ray node (its ``metrics-export-port`` default).
METRICS_PORT = ("metrics", 8080)

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# KubeRay names its objects DNS-1035 labels: a letter first (utils/validation.go).
_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def default_image() -> str:
    """The official Ray image matching this client's Ray and Python versions."""
    return f"rayproject/ray:{_ray_version()}-py{sys.version_info.major}{sys.version_info.minor}"


def _ray_version() -> str:
    """This client's Ray version: the cluster's ``rayVersion`` and image must match it."""
    import ray

    return ray.__version__


# The init container this manifest puts first in every worker pod (see ``_wait_for_head``).
WAIT_FOR_HEAD = "uf-wait-for-head"
# Its connection timeouts, in seconds, for one ``ray health-check``: Ray's defaults (5 s to
# connect, 5 s more for the pubsub channel, then up to 30 s for the cluster id) hold a check
# against a head that does not listen yet for about 40 s.
_HEALTH_CHECK_TIMEOUTS = {"RAY_gcs_rpc_server_connect_timeout_s": "1",
                          "RAY_py_gcs_connect_timeout_s": "1"}
# How long it waits before leaving the wait to KubeRay's own loop (and its troubleshooting
# messages), as that loop's quiet phase does.
_WAIT_FOR_HEAD_S = 120

# A Ray node's own health endpoint on its dashboard agent (Ray 2.53 and later), which KubeRay
# probes for readiness by default: 10 s before the first probe, then every 5 s.
_HEALTH_PATH, _AGENT_PORT = "/api/healthz", 52365
_HEALTH_SINCE = (2, 53)

# Ray's authentication modes a RayCluster can ask KubeRay for (``spec.authOptions.mode``).
AUTH_MODES = ("disabled", "token")
# The key of the token in the Secret KubeRay makes for a cluster in token mode.
AUTH_TOKEN_KEY = "auth_token"


def ray_cluster_manifest(
    task: RayTask,
    *,
    name: str,
    namespace: str = "default",
    image: str | None = None,
    labels: dict[str, str] | None = None,
    storage_secret: str | None = None,
    ttl_s: float = DEFAULT_TTL_S,
    now: float | None = None,
    head_node_ports: dict[str, int] | None = None,
    auth: str = "disabled",
    serving: bool = False,
    cpu_request_fraction: float = 1.0,
) -> dict[str, Any]:
    """A ``RayCluster`` with one head and one worker group shaped like ``task``.

    Args:
        task: The cluster shape.
        name: The RayCluster's name (a DNS-1035 label, as KubeRay requires, at most 50
            characters so that the names KubeRay derives from it stay valid).
        namespace: Where it is created.
        image: Container image of every node; defaults to ``rayproject/ray`` at this client's
            Ray and Python versions, which the cluster must match.
        labels: Extra labels (for example the uniflow run and task) put on the cluster and
            its pods.
        storage_secret: Name of a Secret whose keys become environment variables of every
            node (storage credentials such as ``AWS_ACCESS_KEY_ID``); values never appear in
            the manifest.
        ttl_s: Seconds after which ``michelangelo clusters gc`` may delete the cluster even
            when its run still looks alive.
        now: Creation time used for the expiry annotation (defaults to the current time).
        head_node_ports: Fixed node ports for head ports by name (``{"dashboard": 30265}``),
            for clusters whose nodes map them to the host, as the kind sandbox does.
        auth: Ray's authentication on the cluster: ``"disabled"`` (KubeRay's default) or
            ``"token"``: KubeRay makes a random token, keeps it in a Secret named like the
            cluster, and gives it to every node; clients must send it (``spec.authOptions``).
        serving: The cluster of a RayService. Its worker pods' readiness probe also asks
            their Serve proxy, as KubeRay's does for them (:func:`_readiness_probe`), and in
            token mode they keep KubeRay's wait for the head alone (:func:`_wait_for_head`:
            the token's Secret is named after a cluster name KubeRay makes up).
        cpu_request_fraction: The share of each node's CPUs its pod requests from Kubernetes
            (0 < fraction <= 1). The limit and the CPUs Ray advertises stay as the RayTask
            declares. Below 1, production-shaped tasks fit a small cluster whose CPUs are
            shared, as the kind sandbox on a laptop is.

    Returns:
        The manifest as a plain dict, ready for the Kubernetes API.

    Raises:
        ValueError: If ``name``, ``namespace`` or a label is not valid for Kubernetes, or
            ``auth`` is not one of :data:`AUTH_MODES`.
    """
    check_kuberay_name("name", name, max_len=50)
    if not 0 < cpu_request_fraction <= 1:
        raise InputError(f"cpu_request_fraction={cpu_request_fraction!r} is not in (0, 1]. Fix: "
                         "1 requests every CPU the RayTask declares; 0.25 requests a quarter.")
    if auth not in AUTH_MODES:
        raise InputError(f"auth={auth!r} is not one of {', '.join(AUTH_MODES)}. Fix: "
                         "auth='token' to have KubeRay turn Ray's token authentication on.")
    _check_name("namespace", namespace, max_len=63)
    all_labels = {MANAGED_LABEL: "uniflow", **(labels or {})}
    for key, value in all_labels.items():
        if not isinstance(value, str) or len(value) > 63 or not _LABEL_VALUE.match(value):
            raise InputError(
                f"labels[{key!r}]={value!r} is not a valid Kubernetes label value (at most 63 "
                "letters, digits, '-', '_' or '.', starting and ending with a letter or digit)."
            )
    image = image or default_image()
    created = time.time() if now is None else now
    annotations = {EXPIRES_ANNOTATION: str(int(created + ttl_s))}
    if task.runtime_env:
        annotations[RUNTIME_ENV_ANNOTATION] = json.dumps(task.runtime_env, sort_keys=True)
    env = _environment(task, storage_secret)
    head = node_resources(task, "head")
    worker = node_resources(task, "worker")
    head_params = {**_start_params(head), "dashboard-host": "0.0.0.0"}
    version = _ray_version()
    probe = _readiness_probe(version)
    head_node_ports = dict(head_node_ports or {})
    unknown = sorted(set(head_node_ports) - set(HEAD_PORTS))
    if unknown:
        raise InputError(f"head_node_ports names {unknown}; the head ports are "
                         f"{sorted(HEAD_PORTS)}.")
    spec: dict[str, Any] = {
        "rayVersion": version,
        "enableInTreeAutoscaling": False,
        "headGroupSpec": {
            "rayStartParams": head_params,
            "template": _pod_template(head, "ray-head", image, all_labels, env,
                                      head_ports=_container_ports(head_node_ports),
                                      readiness=probe,
                                      cpu_request_fraction=cpu_request_fraction),
        },
        "workerGroupSpecs": [],
    }
    if head_node_ports:
        spec["headGroupSpec"]["serviceType"] = "NodePort"
        spec["headGroupSpec"]["headService"] = {"spec": {"type": "NodePort", "ports": [
            {"name": port_name, "port": HEAD_PORTS[port_name], "nodePort": node_port}
            for port_name, node_port in sorted(head_node_ports.items())]}}
    if auth == "token":
        spec["authOptions"] = {"mode": "token"}
    if task.worker_instances > 0:
        spec["workerGroupSpecs"].append({
            "groupName": WORKER_GROUP,
            "replicas": task.worker_instances,
            "minReplicas": task.worker_instances,
            "maxReplicas": task.worker_instances,
            "rayStartParams": _start_params(worker),
            "template": _pod_template(worker, "ray-worker", image, all_labels, env,
                                      init_containers=None if serving and auth == "token"
                                      else [_wait_for_head(image, name, auth,
                                                           env.get("env", []))],
                                      readiness=_readiness_probe(version, serve_proxy=True)
                                      if serving else probe,
                                      cpu_request_fraction=cpu_request_fraction),
        })
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": dict(all_labels),
            "annotations": annotations,
        },
        "spec": spec,
    }


def _container_ports(head_node_ports: dict[str, int]) -> list[dict[str, Any]]:
    """The head container's declared ports: those the custom head Service does not carry.

    KubeRay builds the head Service from the container's ports (or, when it declares none,
    from its own defaults, which name every head port) and appends them to a custom
    ``headService`` without removing duplicates; the API server refuses a Service with two
    ports of one name or number. So a port given a node port is declared only in the
    ``headService``, and the metrics port (which KubeRay adds anyway) keeps the list from
    ever being empty.
    """
    ports = [{"name": port_name, "containerPort": port}
             for port_name, port in HEAD_PORTS.items() if port_name not in head_node_ports]
    return ports + [{"name": METRICS_PORT[0], "containerPort": METRICS_PORT[1]}]


def _start_params(node: NodeResources) -> dict[str, str]:
    params = node.start_params()
    if "resources" in params:
        # KubeRay pastes each parameter into the node's shell command line, and reads this one
        # itself as JSON once surrounding quotes are trimmed: single quotes make it one word
        # for the shell and leave the JSON untouched (Ray resource names hold no quotes).
        params["resources"] = f"'{params['resources']}'"
    return params


def container_resources(node: NodeResources,
                        cpu_request_fraction: float = 1.0) -> dict[str, dict[str, str]]:
    """Kubernetes requests and limits: equal, so the node gets what Ray will advertise, but
    for the CPU request when ``cpu_request_fraction`` is below 1 (see
    :func:`ray_cluster_manifest`)."""
    amounts = {"cpu": _cpu_quantity(node.cpus)}
    if node.memory is not None:
        amounts["memory"] = str(node.memory)
    if node.gpus:
        amounts["nvidia.com/gpu"] = str(node.gpus)
    if node.disk is not None:
        amounts["ephemeral-storage"] = str(node.disk)
    requests = dict(amounts)
    if cpu_request_fraction != 1:
        requests["cpu"] = _cpu_quantity(Decimal(str(node.cpus))
                                        * Decimal(str(cpu_request_fraction)))
    return {"requests": requests, "limits": dict(amounts)}


def _readiness_probe(version: str, *, serve_proxy: bool = False) -> dict[str, Any] | None:
    """The readiness probe KubeRay would give a Ray node, asked sooner and more often.

    KubeRay's probe (``/api/healthz`` on the node's dashboard agent) waits 10 s before its
    first try and then 5 s between tries, so a node whose Ray is up in 3 s counts as ready
    after 10 s. This one asks after 1 s and then every second, and allows as many seconds of
    failures (50) before the node counts as not ready again.

    With ``serve_proxy`` (a RayService's worker pods) the probe also asks the node's Serve
    proxy (``/-/healthz`` on the Serve port), as KubeRay's does for those pods, so that
    KubeRay's serve Service sends traffic only to pods whose proxy serves; like KubeRay's,
    one failure takes the pod out of it. It asks every 2 s (KubeRay: 5 s, after 10 s).

    None for a Ray without the health endpoint: KubeRay's own exec probe then applies.
    """
    try:
        major, minor = (int(part) for part in version.split(".")[:2])
    except ValueError:
        return None
    if (major, minor) < _HEALTH_SINCE:
        return None
    if serve_proxy:
        urls = (f"http://localhost:{_AGENT_PORT}{_HEALTH_PATH}",
                f"http://localhost:{HEAD_PORTS['serve']}/-/healthz")
        check = " && ".join(f"wget --tries 1 -T 1 -q -O /dev/null {url}" for url in urls)
        return {"exec": {"command": ["bash", "-c", check]}, "initialDelaySeconds": 1,
                "periodSeconds": 2, "timeoutSeconds": 3, "successThreshold": 1,
                "failureThreshold": 1}
    return {"httpGet": {"path": _HEALTH_PATH, "port": _AGENT_PORT}, "initialDelaySeconds": 1,
            "periodSeconds": 1, "timeoutSeconds": 2, "successThreshold": 1,
            "failureThreshold": 50}


def _wait_for_head(image: str, cluster: str, auth: str,
                   node_env: list[dict[str, Any]]) -> dict[str, Any]:
    """A worker pod's first init container: it waits for the head's GCS, checking often.

    KubeRay adds its own ``wait-gcs-ready`` init container after the pod's own. Its loop
    runs ``ray health-check`` with Ray's default timeouts, so a worker pod that starts with
    its head (the usual case: both are created together) spends its first check, about 40
    s, on a GCS that is still starting, then sleeps 5 s. This one runs the same check with
    1 s timeouts every second, so KubeRay's check passes at its first try a few seconds
    after the GCS listens. After two minutes it leaves the wait to KubeRay's loop, which
    then prints its own troubleshooting messages. It ends on SIGTERM (a deleted pod).
    ``FQ_RAY_IP`` (the head Service's name) is set by KubeRay on every init container; the
    token, in token mode, is given here as KubeRay gives it to its own. Like KubeRay's, it
    also gets the Ray container's ``env`` (the task's ``env_vars``, which may configure Ray's
    client), with its own settings last.
    """
    env = [dict(item) for item in node_env]
    env += [{"name": key, "value": value} for key, value in _HEALTH_CHECK_TIMEOUTS.items()]
    if auth == "token":
        env += [{"name": "RAY_AUTH_MODE", "value": "token"},
                {"name": "RAY_AUTH_TOKEN", "valueFrom": {"secretKeyRef": {
                    "name": cluster, "key": AUTH_TOKEN_KEY}}}]
    # The script is the container's PID 1, which ignores a signal it has no handler for: a
    # pod deleted while it waits (a Ctrl-C during provisioning) would hold the whole
    # termination grace period (30 s) instead of ending after the current check.
    script = (
        "trap 'exit 143' TERM INT\n"
        '[ -n "$FQ_RAY_IP" ] || exit 0\n'
        f'address="$FQ_RAY_IP:{HEAD_PORTS["gcs"]}"\n'
        "SECONDS=0\n"
        'until ray health-check --address "$address" >/dev/null 2>&1; do\n'
        f"  if (( SECONDS >= {_WAIT_FOR_HEAD_S} )); then\n"
        '    echo "no GCS at $address after ${SECONDS}s; KubeRay\'s wait-gcs-ready goes on"\n'
        "    exit 0\n"
        "  fi\n"
        "  sleep 1\n"
        "done\n"
        'echo "GCS at $address answered after ${SECONDS}s"\n'
    )
    return {"name": WAIT_FOR_HEAD, "image": image, "command": ["/bin/bash", "-c", "--"],
            "args": [script], "env": env,
            "resources": {key: dict(WAIT_GCS_READY["resources"][key])
                          for key in ("requests", "limits")}}


def _pod_template(node: NodeResources, container: str, image: str, labels: dict[str, str],
                  env: dict[str, Any], *,
                  head_ports: list[dict[str, Any]] | None = None,
                  init_containers: list[dict[str, Any]] | None = None,
                  readiness: dict[str, Any] | None = None,
                  cpu_request_fraction: float = 1.0) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": container,
        "image": image,
        "resources": container_resources(node, cpu_request_fraction),
        **env,
    }
    if head_ports is not None:
        spec["ports"] = head_ports
    if readiness is not None:
        spec["readinessProbe"] = dict(readiness)
    pod: dict[str, Any] = {"containers": [spec]}
    if init_containers:
        pod["initContainers"] = init_containers
    return {"metadata": {"labels": dict(labels)}, "spec": pod}


def _environment(task: RayTask, storage_secret: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    env_vars = (task.runtime_env or {}).get("env_vars") or {}
    if env_vars:
        out["env"] = [{"name": str(k), "value": str(v)} for k, v in sorted(env_vars.items())]
    if storage_secret:
        _check_name("storage_secret", storage_secret, max_len=253)
        out["envFrom"] = [{"secretRef": {"name": storage_secret}}]
    return out


def _cpu_quantity(cpus: float) -> str:
    value = Decimal(str(cpus))
    if value == value.to_integral_value():
        return str(int(value))
    return f"{int(value * 1000)}m"


def check_kuberay_name(field: str, value: Any, *, max_len: int, kind: str = "RayCluster",
                       example: str = "uf-20261129-train") -> None:
    """Refuse a name the KubeRay operator would reject: a DNS-1035 label of ``max_len``.

    Raises:
        ValueError: Naming the field, the value and the rule, with an example.
    """
    if not isinstance(value, str) or len(value) > max_len or not _DNS1035.match(value):
        too_long = isinstance(value, str) and len(value) > max_len
        raise InputError(
            f"{field}={value!r} is not a valid {kind} name: KubeRay takes at most {max_len} "
            "lower-case letters, digits and '-', starting with a letter and ending with a "
            "letter or digit" + (f" (it is {len(value)} characters long)" if too_long else "")
            + f". Fix: use a name such as {example!r}.")


def _check_name(field: str, value: Any, *, max_len: int) -> None:
    if not isinstance(value, str) or len(value) > max_len or not _NAME.match(value):
        raise InputError(
            f"{field}={value!r} is not a valid Kubernetes name: use at most {max_len} lower-case "
            "letters, digits and '-', starting and ending with a letter or digit "
            "(e.g. 'uf-20261129-train')."
        )
