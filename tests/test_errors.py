"""One exception root for the SDK: every error it raises on purpose, user or system side."""

from __future__ import annotations

import pickle

import pytest

from michelangelo.errors import InputError, MichelangeloError, ServiceError
from michelangelo.lib.model_registry import (
    ModelRegistry,
    ModelRegistryError,
    RevisionNotFoundError,
    WeightsIntegrityError,
)
from michelangelo.lib.serving import DeploymentError, DeploymentNotFoundError, ServingError
from michelangelo.sandbox import SandboxError
from michelangelo.uniflow.core import RunNotFoundError, TaskTimeoutError, UserError
from michelangelo.uniflow.core.errors import ClusterError, RemoteTaskError
from michelangelo.uniflow.plugins.ray import CapacityError, ResourcesUnavailableError
from michelangelo.uniflow.report import build_report

USER_SIDE = [UserError, RunNotFoundError, CapacityError, ResourcesUnavailableError,
             RevisionNotFoundError, DeploymentNotFoundError]
SYSTEM_SIDE = [ClusterError, TaskTimeoutError, SandboxError, WeightsIntegrityError]
ROOTS_ONLY = [RemoteTaskError, ModelRegistryError, ServingError, DeploymentError]
# What each type was before the root came, and still is.
KEPT_BASES = {UserError: ValueError, CapacityError: ValueError, ModelRegistryError: ValueError,
              RevisionNotFoundError: LookupError, DeploymentNotFoundError: LookupError,
              SandboxError: RuntimeError, TaskTimeoutError: TimeoutError}


@pytest.mark.parametrize("kind", USER_SIDE + SYSTEM_SIDE + ROOTS_ONLY,
                         ids=lambda kind: kind.__name__)
def test_every_sdk_error_has_the_one_root_and_keeps_its_type_across_pickling(kind):
    error = kind("the message")
    assert isinstance(error, MichelangeloError)
    assert isinstance(error, InputError) == (kind in USER_SIDE)
    assert isinstance(error, ServiceError) == (kind in SYSTEM_SIDE)
    if kind in KEPT_BASES:
        assert isinstance(error, KEPT_BASES[kind])
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is kind and str(copy) == "the message"


def test_kube_and_fit_errors_are_on_their_sides():
    from michelangelo.uniflow.plugins.ray.kuberay import ClusterFitError, KubeError

    refused = KubeError("forbidden", status=403, reason="Forbidden")
    assert isinstance(refused, ServiceError) and isinstance(refused, RuntimeError)
    copy = pickle.loads(pickle.dumps(refused))
    assert (copy.status, copy.reason) == (403, "Forbidden")
    assert isinstance(ClusterFitError("too big"), InputError)


def test_one_except_catches_what_the_sdk_raises(tmp_path):
    with pytest.raises(InputError, match="nope"):
        build_report("nope")
    with pytest.raises(MichelangeloError) as caught:
        ModelRegistry(str(tmp_path / "registry")).get("proj/model:1")
    assert isinstance(caught.value, InputError)


@pytest.mark.parametrize("kind", USER_SIDE, ids=lambda kind: kind.__name__)
def test_every_input_error_is_a_value_error_as_the_guide_says(kind):
    assert issubclass(InputError, ValueError)
    with pytest.raises(ValueError):
        raise kind("bad value")
