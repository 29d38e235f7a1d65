"""The settings file: written whole with mode 0600, read back, clear errors when absent."""

from __future__ import annotations

import json
import os
import stat

import pytest

from michelangelo.sandbox import SandboxError, SandboxSettings, load_sandbox_settings
from michelangelo.sandbox._settings import write_sandbox_settings


def _settings() -> SandboxSettings:
    return SandboxSettings(
        kube_context="kind-michelangelo", namespace="michelangelo", image="m:1",
        storage_url="s3://michelangelo/uniflow", s3_endpoint="http://127.0.0.1:9000",
        s3_endpoint_in_cluster="http://minio.michelangelo.svc.cluster.local:9000",
        storage_secret="michelangelo-storage", node_ports={"s3": 30900},
        access_key="AKEY-not-shown", secret_key="SKEY-not-shown")


def test_round_trip_private_file(tmp_path, monkeypatch):
    path = str(tmp_path / "deeper" / "sandbox.json")
    monkeypatch.setenv("MA_SANDBOX_FILE", path)
    old = os.umask(0)  # the mode must not depend on the user's umask
    try:
        written = write_sandbox_settings(_settings())
    finally:
        os.umask(old)
    assert written == path
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert load_sandbox_settings() == _settings()
    assert os.listdir(tmp_path / "deeper") == ["sandbox.json"]  # no temporary left behind
    text = repr(load_sandbox_settings())
    assert "not-shown" not in text and "s3://michelangelo/uniflow" in text
    env = _settings().client_environment()
    assert env["AWS_ENDPOINT_URL"] == "http://127.0.0.1:9000"


def test_missing_and_damaged(tmp_path):
    path = tmp_path / "sandbox.json"
    with pytest.raises(SandboxError, match="run 'michelangelo sandbox create' first"):
        load_sandbox_settings(str(path))
    path.write_text("{not json")
    with pytest.raises(SandboxError, match="not valid JSON"):
        load_sandbox_settings(str(path))
    path.write_text(json.dumps({"namespace": "x"}))
    with pytest.raises(SandboxError, match="lack .*'image'"):
        load_sandbox_settings(str(path))
