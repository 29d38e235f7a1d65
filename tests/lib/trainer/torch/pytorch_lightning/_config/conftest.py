"""What the driver-side checks of ``_config`` are tried against."""

from __future__ import annotations

import pytest
from _models import make_regression_datasets


@pytest.fixture(scope="module")
def data(ray_cluster):
    """A small regression train and validation set, as Ray Datasets."""
    return make_regression_datasets(16, 8)
