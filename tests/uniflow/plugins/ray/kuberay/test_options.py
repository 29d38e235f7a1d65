"""remote-run --kuberay options are checked when the context is made, before any cluster."""

from __future__ import annotations

import pytest

import michelangelo.uniflow.plugins.ray  # noqa: F401  (registers the options)
from michelangelo.uniflow.core import Context
from michelangelo.uniflow.core.errors import UserError
from michelangelo.uniflow.plugins.ray.kuberay._dispatch import settings_from


def test_head_access_is_checked_up_front():
    with pytest.raises(UserError, match="'sideways' is not one of auto, pod, port-forward"):
        Context("remote-run", options={"kuberay": True, "head_access": "sideways"})


def test_head_access_needs_kuberay():
    with pytest.raises(UserError, match="--head-access only applies with remote-run --kuberay"):
        Context("remote-run", options={"ray_address": "http://h:8265", "head_access": "pod"})


def test_head_access_reaches_the_settings():
    assert settings_from({"kuberay": True}).head_access == "auto"
    assert settings_from({"kuberay": True, "head_access": "port-forward"}).head_access == \
        "port-forward"


def test_auth_is_checked_up_front_needs_kuberay_and_reaches_the_settings():
    with pytest.raises(UserError, match="--auth 'yes' is not one of disabled, token. Fix"):
        Context("remote-run", options={"kuberay": True, "auth": "yes"})
    with pytest.raises(UserError, match="--auth only applies with remote-run --kuberay"):
        Context("remote-run", options={"ray_address": "http://h:8265", "auth": "token"})
    assert settings_from({"kuberay": True}).auth == "disabled"
    assert settings_from({"kuberay": True, "auth": "token"}).auth == "token"
