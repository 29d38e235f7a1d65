"""RayService roll-outs against the real KubeRay operator (the kubelet is a test double): a
Serve-config-only update keeps the cluster and is waited for until the new application runs,
and an application Serve cannot deploy fails the wait with Serve's own message."""

from __future__ import annotations

import copy
import time

import pytest

from michelangelo.lib.serving._gateway import serve_config_entry
from michelangelo.uniflow.core.errors import ClusterError
from michelangelo.uniflow.plugins.ray import RayTask
from michelangelo.uniflow.plugins.ray.kuberay import ray_service_manifest
from michelangelo.uniflow.plugins.ray.kuberay._service import (
    apply_ray_service,
    wait_for_service,
)

HEAD_ONLY = RayTask(head_cpu=1, head_memory="2Gi", worker_instances=0)


def _apps(obj):
    return {name: app.get("status") for name, app in
            ((obj.get("status") or {}).get("activeServiceStatus") or {})
            .get("applicationStatuses", {}).items()}


def _wait_removed(api, name):
    """Until the RayService and every Ray pod are gone (the real garbage collector's work)."""
    deadline = time.monotonic() + 120
    while api.get("RayService", name, "default") is not None or \
            api.pods("default", "ray.io/is-ray-node=yes"):
        assert time.monotonic() < deadline, "the RayService or its pods were not removed"
        time.sleep(0.5)


def test_a_serve_config_update_is_waited_for_and_a_failed_app_is_reported(api, kube_cluster):
    _, kubelet = kube_cluster
    name = "rollout-check"
    config = {"applications": [serve_config_entry()]}
    lines: list[str] = []
    try:
        applied = apply_ray_service(api, ray_service_manifest(config, HEAD_ONLY, name=name))
        first = wait_for_service(api, name, "default", deadline_s=300, on_progress=lines.append,
                                 applied=applied)
        cluster = first["status"]["activeServiceStatus"]["rayClusterName"]
        assert _apps(first) == {"_oip": "RUNNING"}

        # Only the Serve config changes: KubeRay keeps the cluster and stays Ready through
        # it, so the wait must hold out for the new application itself.
        second = copy.deepcopy(config)
        second["applications"].append({**serve_config_entry(), "name": "second",
                                       "route_prefix": "/second"})
        applied = apply_ray_service(api, ray_service_manifest(second, HEAD_ONLY, name=name))
        served = wait_for_service(api, name, "default", deadline_s=300,
                                  on_progress=lines.append, applied=applied, updated=True)
        assert served["status"]["activeServiceStatus"]["rayClusterName"] == cluster
        assert _apps(served) == {"_oip": "RUNNING", "second": "RUNNING"}

        # An application whose code is not there: Serve gives up, and the wait says why.
        broken = copy.deepcopy(second)
        broken["applications"].append({**serve_config_entry(), "name": "broken",
                                       "route_prefix": "/broken",
                                       "import_path": "no_such_module_here:app"})
        applied = apply_ray_service(api, ray_service_manifest(broken, HEAD_ONLY, name=name))
        with pytest.raises(ClusterError) as info:
            wait_for_service(api, name, "default", deadline_s=300, on_progress=lines.append,
                             applied=applied, updated=True)
        message = str(info.value)
        assert "Serve could not deploy broken:" in message, message
        assert "no_such_module_here" in message, message
    finally:
        api.delete("RayService", name, "default")
    _wait_removed(api, name)
    assert kubelet.errors == []


def test_a_token_rayservice_gets_its_serve_config_through_and_serves_without_the_token(
        api, kube_cluster):
    """``auth="token"`` on a RayService: the serving cluster's dashboard wants the token, the
    real operator sends it with the Serve config it submits (so the application runs), the
    dashboard refuses a request without it, and Serve's own HTTP endpoint, which is not
    behind Ray's token, answers clients as it would without authentication."""
    import json
    import urllib.error
    import urllib.request

    _, kubelet = kube_cluster
    name = "token-serve"
    manifest = ray_service_manifest({"applications": [serve_config_entry()]}, HEAD_ONLY,
                                    name=name, auth="token")
    assert manifest["spec"]["rayClusterConfig"]["authOptions"] == {"mode": "token"}
    try:
        applied = apply_ray_service(api, manifest)
        served = wait_for_service(api, name, "default", deadline_s=300, on_progress=print,
                                  applied=applied)
        assert _apps(served) == {"_oip": "RUNNING"}
        cluster = served["status"]["activeServiceStatus"]["rayClusterName"]
        assert api.secret_value(cluster, "default", "auth_token")  # the operator's token
        (head,) = api.pods("default", f"ray.io/cluster={cluster},ray.io/node-type=head")
        ip = head["status"]["podIP"]
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"http://{ip}:8265/api/serve/applications/", timeout=10)
        assert refused.value.code in (401, 403)
        with urllib.request.urlopen(f"http://{ip}:8000/v2/health/ready", timeout=30) as answer:
            assert answer.status == 200
        with urllib.request.urlopen(f"http://{ip}:8000/v2", timeout=30) as answer:
            assert "name" in json.loads(answer.read())
    finally:
        api.delete("RayService", name, "default")
    _wait_removed(api, name)
    assert kubelet.errors == []
