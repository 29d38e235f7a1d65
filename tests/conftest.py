"""Test-wide settings: every test gets its own uniflow storage root."""

from __future__ import annotations

import os

import pytest

# Plain ray.init() calls in tests must never join a cluster some other process made default.
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# Ray Train watches for node preemption, and there is none on one machine. Set before any Ray
# is started so that controllers, local clusters and job drivers inherit it. (How often the
# controller polls is LightningTrainer's own setting, as users get it: see _poll_interval.)
os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")


# Variables whose leak out of one test module breaks later ones in ways far from the cause
# (a `ray start` that finds no bash on PATH, a cluster joined through RAY_ADDRESS).
_GUARDED_ENV = ("PATH", "HOME", "PYTHONPATH", "KUBECONFIG", "RAY_ADDRESS", "UF_STORAGE_URL",
                "MA_MODEL_REGISTRY_URL")


@pytest.fixture(autouse=True, scope="module")
def _environment_does_not_leak(request):
    before = {name: os.environ.get(name) for name in _GUARDED_ENV}
    yield
    leaked = {name: os.environ.get(name) for name in _GUARDED_ENV
              if os.environ.get(name) != before[name]}
    for name in leaked:
        if before[name] is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before[name]
    if leaked:
        pytest.fail(f"{request.module.__name__} left environment variables changed: {leaked}")


@pytest.fixture(autouse=True)
def _uniflow_storage(tmp_path, monkeypatch):
    monkeypatch.setenv("UF_STORAGE_URL", str(tmp_path / "uniflow"))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    yield
