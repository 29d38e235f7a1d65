"""Pod diagnosis read from pod statuses a real kubelet wrote.

``real_kubelet_pods.json`` holds pods recorded (``kubectl get pod -o json``, metadata and
status kept) from the kind sandbox: Kubernetes v1.36.3's kubelet with containerd. The pods:
a container that exits 3 at once (10 s and 45 s after creation), an image that cannot be
pulled, an env var from a missing Secret, a readiness probe before and after it passes, and a
KubeRay worker whose init containers are running.
"""

from __future__ import annotations

import json
import os

import pytest

from michelangelo.uniflow.plugins.ray.kuberay._pod_diagnosis import (
    fatal_reason,
    last_words,
    pending_reasons,
)

with open(os.path.join(os.path.dirname(__file__), "real_kubelet_pods.json")) as _handle:
    REAL = json.load(_handle)


class _Logs:
    """Stands in for KubeApi.container_log: records which run's log was asked for."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, str, bool]] = []

    def container_log(self, namespace, pod, container, *, previous, tail_lines):
        self.asked.append((pod, container, previous))
        return "dying\n"


def test_a_crash_loop_in_the_shape_a_1_36_kubelet_writes_is_fatal_after_three_restarts():
    early, late = REAL["case-crash-t10"], REAL["case-crash-t45"]
    # Between restarts the crashed run is the container's state: terminated, reason Error.
    assert early["status"]["containerStatuses"][0]["state"]["terminated"]["reason"] == "Error"
    assert fatal_reason([early]) is None  # one restart: it may still come up
    reason = fatal_reason([late])
    assert reason == ("case-crash: CrashLoopBackOff after 3 restarts: container c exited "
                      "with code 3 (Error)")
    logs = _Logs()
    words = last_words(logs, "michelangelo", [late])
    # the run that ended is the current one in this shape: plain `kubectl logs`
    assert logs.asked == [("case-crash", "c", False)]
    assert "(kubectl logs):" in words and "  dying" in words
    assert "case-crash: container c exited with code 3 (Error); restarted 1 time(s)" in \
        pending_reasons([early], [])


@pytest.mark.parametrize(("case", "expected"), [
    ("case-bad-image-t45", 'case-bad-image: ImagePullBackOff: Back-off pulling image '
                           '"example.invalid/nothing:1": ErrImagePull: failed to pull and unpack'),
    ("case-missing-secret-t45",
     'case-missing-secret: CreateContainerConfigError: secret "no-such-secret" not found'),
])
def test_reasons_that_do_not_heal_are_fatal_with_the_kubelets_words(case, expected):
    assert fatal_reason([REAL[case]]).startswith(expected)


def test_a_probe_not_passed_yet_and_running_init_containers_are_not_fatal():
    for case in ("case-probe-t6", "case-probe-t45", "worker-init-running"):
        assert fatal_reason([REAL[case]]) is None, case
    worker = REAL["worker-init-running"]
    assert pending_reasons([worker], []) == [f"{worker['metadata']['name']}: PodInitializing"]


def test_an_init_containers_image_problem_is_read_where_the_kubelet_puts_it():
    """A worker's first init container runs the Ray image: a pull failure shows there, and
    the Ray container only waits (PodInitializing)."""
    worker = json.loads(json.dumps(REAL["worker-init-running"]))
    bad = REAL["case-bad-image-t45"]["status"]["containerStatuses"][0]["state"]
    worker["status"]["initContainerStatuses"][0]["state"] = bad
    name = worker["metadata"]["name"]
    assert fatal_reason([worker]).startswith(f"{name}: ImagePullBackOff: Back-off pulling")
