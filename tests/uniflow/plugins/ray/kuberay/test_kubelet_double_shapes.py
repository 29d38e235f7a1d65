"""The kubelet double's pod statuses against those a real kubelet wrote.

``real_kubelet_pods.json`` holds pods recorded from the kind sandbox (Kubernetes v1.36.3's
kubelet with containerd; see ``test_pod_diagnosis``). For each one the double is put in the
same situation (the same containers, the same runs ended or running) and the status it would
write is compared field by field with the real one: the phase, the conditions (their order,
reasons and messages), and each container's state, reason, exit code, ``restartCount``,
``ready``, ``started`` and ``lastState``. Left out: what the double has no source for
(``volumeMounts``, ``resources``, ``qosClass``, ``observedGeneration``) and the values that
differ by nature (IDs, addresses, times).
"""

from __future__ import annotations

import json
import os
import time
from types import SimpleNamespace

import pytest

from tools.kuberay_bed import PodRecord, pod_status

with open(os.path.join(os.path.dirname(__file__), "real_kubelet_pods.json")) as _handle:
    REAL = json.load(_handle)

# Fields the double does not write: nothing in it stands for them.
_UNSOURCED = {"volumeMounts", "resources", "allocatedResources", "user"}
_RUNNING = object()  # the record's process, for a container that runs


def _pod(real):
    """The pod's containers (the recording kept the statuses, which name them in order)."""
    def containers(key):
        return [SimpleNamespace(name=c["name"], image=c["image"])
                for c in real["status"].get(key) or []]
    return SimpleNamespace(spec=SimpleNamespace(
        init_containers=containers("initContainerStatuses"),
        containers=containers("containerStatuses")))


def _run(code=None):
    run = {"containerID": "containerd://" + "ab" * 32, "startedAt": "2026-01-01T00:00:00Z"}
    if code is not None:
        run.update(finishedAt="2026-01-01T00:00:01Z", exitCode=code,
                   reason="Completed" if code == 0 else "Error")
    return run


def _record(**fields):
    record = PodRecord("p", "198.18.0.9", fields.pop("proc", None), "/dev/null", "/tmp", False)
    for key, value in fields.items():
        setattr(record, key, value)
    return record


def _situations(pod):
    """What the double knows in each recorded case, set as its own run loop would set it."""
    image = pod.spec.containers[0].image
    return {
        # never started: the image is in no registry, tried for 45 s
        "case-bad-image-t45": _record(extra={"image_error": image},
                                      admitted=time.monotonic() - 45),
        # exits 3 at once: two runs ended (10 s), four runs ended (45 s), between restarts
        "case-crash-t10": _record(runs={"c": [_run(3), _run(3)]}, restart_at=1e18),
        "case-crash-t45": _record(runs={"c": [_run(3)] * 4}, restart_at=1e18),
        "case-missing-secret-t45": _record(waiting={
            "reason": "CreateContainerConfigError",
            "message": 'secret "no-such-secret" not found'}),
        # an init container that sleeps, then a container whose readiness probe passes
        "case-probe-t6": _record(runs={"init": [_run()]}, proc=_RUNNING),
        "case-probe-t45": _record(runs={"init": [_run(0)], "c": [_run()]}, init_index=1,
                                  proc=_RUNNING, ready=True),
        # a KubeRay worker in its first init container
        "worker-init-running": _record(runs={"uf-wait-for-head": [_run()]}, proc=_RUNNING),
    }


def _container_shape(status):
    (kind, state), = status["state"].items()
    return {
        "name": status["name"],
        "fields": sorted(set(status) - _UNSOURCED),
        "state": kind, "state fields": sorted(state),
        "reason": state.get("reason"), "exit code": state.get("exitCode"),
        "restartCount": status["restartCount"], "ready": status["ready"],
        "started": status["started"],
        "lastState": {k: (v.get("reason"), v.get("exitCode"))
                      for k, v in status["lastState"].items()},
        "has an image ID": bool(status["imageID"]),
    }


def _shape(status):
    return {
        "phase": status["phase"],
        "fields": sorted(set(status) - {"observedGeneration", "qosClass", "resources",
                                        "allocatedResources"}),
        "conditions": [(c["type"], c["status"], c.get("reason"), c.get("message"),
                        sorted(set(c) - {"observedGeneration"}))
                       for c in status["conditions"]],
        "init containers": [_container_shape(s)
                            for s in status.get("initContainerStatuses") or []],
        "containers": [_container_shape(s) for s in status["containerStatuses"]],
    }


@pytest.mark.parametrize("case", sorted(REAL))
def test_the_double_writes_the_status_a_real_kubelet_wrote(case):
    real = REAL[case]
    pod = _pod(real)
    record = _situations(pod)[case]
    assert _shape(pod_status(pod, record)) == _shape(real["status"])


def test_an_image_no_registry_has_alternates_err_image_pull_and_back_off_as_the_real_one():
    real = REAL["case-bad-image-t45"]
    pod = _pod(real)
    image = pod.spec.containers[0].image
    reasons = []
    for elapsed in (0.5, 5, 10.5, 20, 30.5, 45):
        record = _record(extra={"image_error": image}, admitted=time.monotonic() - elapsed)
        reasons.append(pod_status(pod, record)["containerStatuses"][0]["state"]["waiting"])
    assert [w["reason"] for w in reasons] == ["ErrImagePull", "ImagePullBackOff",
                                              "ErrImagePull", "ImagePullBackOff",
                                              "ErrImagePull", "ImagePullBackOff"]
    # the same words as the real kubelet's, up to the resolver's own error
    real_message = real["status"]["containerStatuses"][0]["state"]["waiting"]["message"]
    prefix = (f'Back-off pulling image "{image}": ErrImagePull: failed to pull and unpack '
              f'image "{image}": failed to resolve reference "{image}": ')
    assert real_message.startswith(prefix) and reasons[-1]["message"].startswith(prefix)


def test_transition_times_move_only_when_a_condition_changes():
    real = REAL["case-probe-t45"]
    pod = _pod(real)
    record = _situations(pod)["case-probe-t45"]
    record.ready = False
    pod_status(pod, record)
    record.transitions = {k: (v[0], "2026-01-01T00:00:00Z") for k, v in
                          record.transitions.items()}
    record.ready = True
    after = {c["type"]: c["lastTransitionTime"] for c in pod_status(pod, record)["conditions"]}
    assert after["PodScheduled"] == after["Initialized"] == "2026-01-01T00:00:00Z"
    assert after["Ready"] == after["ContainersReady"] != "2026-01-01T00:00:00Z"
