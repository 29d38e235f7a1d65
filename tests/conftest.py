"""Test-wide settings: every test gets its own uniflow storage root."""

from __future__ import annotations

import os

import pytest

# Plain ray.init() calls in tests must never join a cluster some other process made default.
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


@pytest.fixture(autouse=True)
def _uniflow_storage(tmp_path, monkeypatch):
    monkeypatch.setenv("UF_STORAGE_URL", str(tmp_path / "uniflow"))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    yield
