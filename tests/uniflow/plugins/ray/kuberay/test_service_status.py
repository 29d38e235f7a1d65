"""How a RayService's status reads to the client: ready, upgrading, failed applications.

The status sequences follow the real operator at tag ``ray-operator/v1.7.0``
(``ray-operator/controllers/ray/rayservice_controller.go``): ``Ready`` means serve endpoints
exist (``calculateStatus``), and ``reconcileServe`` reads the applications' statuses from the
dashboard *before* it submits a changed Serve config, writing them with the new
``observedGeneration`` in the same pass; a refused RayService gets ``Ready`` False with reason
``ValidationFailed``.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from michelangelo.uniflow.core.errors import ClusterError
from michelangelo.uniflow.plugins.ray.kuberay import _service as service_module
from michelangelo.uniflow.plugins.ray.kuberay._service import (
    _failed_application,
    service_ready,
    service_status,
    service_url,
    wait_for_service,
)

_RUNNING = {"churn": {"status": "RUNNING"}}


def _service(generation=2, observed=2, ready="True", upgrading="False", apps=None,
             version="10", reason="NonZeroServeEndpoints", message=""):
    return {"metadata": {"name": "churn", "namespace": "ml", "generation": generation,
                         "resourceVersion": version},
            "spec": {"serveConfigV2": yaml.safe_dump({"applications": [
                {"name": "churn", "import_path": "m:app", "route_prefix": "/churn"}]})},
            "status": {"observedGeneration": observed,
                       "conditions": [{"type": "Ready", "status": ready, "reason": reason,
                                       "message": message},
                                      {"type": "UpgradeInProgress", "status": upgrading}],
                       "activeServiceStatus": {"rayClusterName": "churn-raycluster-a1",
                                               "applicationStatuses": _RUNNING if apps is None
                                               else apps}}}


def test_ready_only_for_the_spec_last_written():
    assert service_ready(_service())
    assert not service_ready(_service(generation=3))  # KubeRay has not seen the update yet
    assert not service_ready(_service(upgrading="True"))
    assert not service_ready(_service(ready="False"))


def test_ready_needs_every_application_of_the_config_running():
    """KubeRay's ``Ready`` only counts serve endpoints, which an old app keeps up."""
    assert not service_ready(_service(apps={"churn": {"status": "DEPLOYING"}}))
    assert not service_ready(_service(apps={}))
    assert not service_ready(_service(apps={"old-app": {"status": "RUNNING"}}))


def test_status_line_names_state_and_applications():
    line = service_status(_service(apps={"churn": {"status": "RUNNING"}}))
    assert line == "RayService ml/churn: ready (churn RUNNING)"
    assert service_status(_service(upgrading="True")).endswith(": upgrading (churn RUNNING)")
    assert service_url("churn", "ml", "/churn") == "http://churn-serve-svc.ml.svc:8000/churn"


def test_a_failed_application_is_found_with_its_message():
    status = _service(apps={"churn": {"status": "DEPLOY_FAILED",
                                      "message": "ValueError: bad weights"}})["status"]
    assert _failed_application(status) == "churn: ValueError: bad weights"
    assert _failed_application(_service(apps={"churn": {"status": "RUNNING"}})["status"]) is None


class _KubeApiDouble:
    """TEST DOUBLE of ``KubeApi``: the RayService reads as the given writes, one per poll
    (the last one stays), with no pods or events."""

    def __init__(self, writes: list[dict[str, Any]]) -> None:
        self.writes = list(writes)

    def get(self, kind: str, name: str, namespace: str) -> dict[str, Any]:
        return self.writes.pop(0) if len(self.writes) > 1 else self.writes[0]

    def pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        return []

    def events(self, namespace: str) -> list[dict[str, Any]]:
        return []


@pytest.fixture(autouse=True)
def _fast_polls(monkeypatch):
    monkeypatch.setattr(service_module, "_POLL_S", 0.0)


def _wait(writes, *, updated=True, applied_version="9"):
    return wait_for_service(_KubeApiDouble(writes), "churn", "ml", deadline_s=30,
                            on_progress=lambda line: None, updated=updated,
                            applied={"metadata": {"resourceVersion": applied_version}})


def test_a_serve_config_update_waits_for_the_new_applications():
    # The pass that submits the new config still shows the old app RUNNING (and Ready).
    old = _service(version="11")
    deploying = _service(version="12", apps={"churn": {"status": "DEPLOYING"}})
    running = _service(version="13")
    assert _wait([old, deploying, running])["metadata"]["resourceVersion"] == "13"


def test_a_serve_config_update_that_fails_reports_the_apps_message():
    old = _service(version="11")
    failed = _service(version="12", apps={"churn": {
        "status": "DEPLOY_FAILED", "message": "RuntimeError: weights sha256 mismatch"}})
    with pytest.raises(ClusterError, match="could not deploy churn: RuntimeError: weights "
                                           "sha256 mismatch"):
        _wait([old, failed])


def test_an_update_serve_applied_within_one_pass_counts_once_it_stood(monkeypatch):
    monkeypatch.setattr(service_module._Rollout, "SETTLE_S", 0.0)
    assert _wait([_service(version="11")])["metadata"]["resourceVersion"] == "11"


def test_a_new_service_is_ready_at_its_first_running_write():
    assert _wait([_service(version="11")], updated=False)["metadata"]["resourceVersion"] == "11"


def test_kuberays_validation_failure_is_reported_with_its_message():
    message = ("The RayService metadata is invalid: RayService name should be no more than "
               "47 characters")
    refused = _service(version="11", ready="False", reason="ValidationFailed", message=message,
                       observed=0, apps={})
    with pytest.raises(ClusterError, match=f"KubeRay refused RayService ml/churn: {message}"):
        _wait([refused], updated=False)
