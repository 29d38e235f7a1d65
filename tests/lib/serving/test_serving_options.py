"""deploy()'s endpoint options are DeploymentDescription's fields: one definition, no drift."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from michelangelo.lib.model_registry import ModelRegistry
from michelangelo.lib.serving import DeploymentDescription, deploy


def test_deploy_offers_each_endpoint_setting_with_the_descriptions_default():
    fields = {f.name: f.default for f in dataclasses.fields(DeploymentDescription)
              if f.default is not dataclasses.MISSING and f.name != "registry_url"}
    params = inspect.signature(deploy).parameters
    offered = {name: p.default for name, p in params.items()
               if name not in ("spec", "name", "registry", "canary", "traffic", "auto_rollback")}
    assert offered == fields
    assert fields["host"] == "127.0.0.1"  # loopback unless told otherwise


def test_an_unknown_option_is_refused_with_the_known_ones_before_any_cluster(tmp_path):
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['replicas'\].*'num_replicas'"):
        deploy("proj/model@prod", registry=ModelRegistry(str(tmp_path / "r")), replicas=2)
