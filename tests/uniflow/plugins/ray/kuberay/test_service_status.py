"""How a RayService's status reads to the client: ready, upgrading, failed applications."""

from __future__ import annotations

from michelangelo.uniflow.plugins.ray.kuberay._service import (
    _failed_application,
    service_ready,
    service_status,
    service_url,
)


def _service(generation=2, observed=2, ready="True", upgrading="False", apps=None):
    return {"metadata": {"name": "churn", "namespace": "ml", "generation": generation},
            "status": {"observedGeneration": observed,
                       "conditions": [{"type": "Ready", "status": ready},
                                      {"type": "UpgradeInProgress", "status": upgrading}],
                       "activeServiceStatus": {"rayClusterName": "churn-raycluster-a1",
                                               "applicationStatuses": apps or {}}}}


def test_ready_only_for_the_spec_last_written():
    assert service_ready(_service())
    assert not service_ready(_service(generation=3))  # KubeRay has not seen the update yet
    assert not service_ready(_service(upgrading="True"))
    assert not service_ready(_service(ready="False"))


def test_status_line_names_state_and_applications():
    line = service_status(_service(apps={"churn": {"status": "RUNNING"}}))
    assert line == "RayService ml/churn: ready (churn RUNNING)"
    assert service_status(_service(upgrading="True")).endswith(": upgrading")
    assert service_url("churn", "ml", "/churn") == "http://churn-serve-svc.ml.svc:8000/churn"


def test_a_failed_application_is_found_with_its_message():
    status = _service(apps={"churn": {"status": "DEPLOY_FAILED",
                                      "message": "ValueError: bad weights"}})["status"]
    assert _failed_application(status) == "churn: ValueError: bad weights"
    assert _failed_application(_service(apps={"churn": {"status": "RUNNING"}})["status"]) is None
