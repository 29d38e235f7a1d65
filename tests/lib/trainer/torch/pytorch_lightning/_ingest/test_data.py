"""Training iterables: exact length, shuffle buffer on/off, collate function."""

from __future__ import annotations

import pytest
import torch
from _models import make_regression_datasets

from michelangelo.lib.trainer.torch.pytorch_lightning._ingest._data import (
    SizedBatches,
    rows_per_worker,
)

RAY_NUM_CPUS = 2
RAY_PRESERVE_ORDER = True  # the order tests compare two passes over one shard


@pytest.fixture(scope="module")
def shard(ray_cluster):
    train, _ = make_regression_datasets(48, 8)
    return train.iterator()


def ys(batches):
    return [float(v) for batch in batches for v in batch["y"]]


def test_rows_per_worker_matches_equal_split():
    assert rows_per_worker(65, 2) == 32
    assert rows_per_worker(7, 0) == 7


def test_length_is_exact(shard):
    assert len(SizedBatches(shard, 48, 8)) == 6 == len(list(SizedBatches(shard, 48, 8)))
    assert len(SizedBatches(shard, 48, 10)) == 5 == len(list(SizedBatches(shard, 48, 10)))
    assert len(SizedBatches(shard, 48, 10, drop_last=True)) == 4


def test_shuffle_off_keeps_order_and_on_reorders(shard):
    ordered = ys(SizedBatches(shard, 48, 8, shuffle_buffer_rows=None))
    assert ordered == ys(SizedBatches(shard, 48, 8, shuffle_buffer_rows=None))
    shuffled = ys(SizedBatches(shard, 48, 8, shuffle_buffer_rows=80))
    assert shuffled != ordered and sorted(shuffled) == sorted(ordered)
    # Re-iterating gives a new epoch with a new order.
    assert ys(SizedBatches(shard, 48, 8, shuffle_buffer_rows=80)) != shuffled


def test_collate_fn_replaces_tensor_conversion(shard):
    def collate(batch):
        return torch.as_tensor(batch["x"]).sum(dim=1), len(batch["y"])

    batches = list(SizedBatches(shard, 48, 8, collate_fn=collate))
    assert all(isinstance(b, tuple) and b[1] == 8 for b in batches)
    default = list(SizedBatches(shard, 48, 8))  # consumed fully: no prefetcher left behind
    assert isinstance(default[0]["x"], torch.Tensor) and default[0]["x"].shape == (8, 8)


def test_default_batches_are_the_tensors_ray_would_give(shard):
    # The streaming path converts numpy batches itself (faster); the result must not differ.
    ours = list(SizedBatches(shard, 48, 8))
    rays = list(shard.iter_torch_batches(batch_size=8, device="cpu"))
    assert len(ours) == len(rays) == 6
    for a, b in zip(ours, rays, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key])
