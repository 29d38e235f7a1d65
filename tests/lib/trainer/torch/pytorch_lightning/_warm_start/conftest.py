"""What the warm-start tests train on."""

from __future__ import annotations

import pytest
from _models import make_regression_datasets


@pytest.fixture
def data(ray_cluster, monkeypatch):
    """A regression train and validation set, read through the streaming path: warm starts do
    not depend on how batches reach the workers (``test_weights`` has a smaller set of its own)."""
    monkeypatch.setenv("MA_TRAINER_INMEMORY", "0")
    return make_regression_datasets(64, 16)
