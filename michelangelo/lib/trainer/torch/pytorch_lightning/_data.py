"""Ray Data shards as Lightning training iterables that know their length.

Lightning needs ``len()`` of the training iterable to know ``num_training_batches`` and so
``estimated_stepping_batches``; a bare Ray iterator has none, and a step-interval schedule
sized from it would never reach its floor.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["SizedBatches", "rows_per_worker"]


def rows_per_worker(total_rows: int, world_size: int) -> int:
    """Rows each worker sees: Ray Train splits with ``streaming_split(equal=True)``."""
    return total_rows // max(world_size, 1)


class SizedBatches:
    """Re-iterable batches of one worker's dataset shard, with a length.

    Args:
        shard: The worker's ``ray.data.DataIterator`` (``ray.train.get_dataset_shard``).
        rows: Rows this worker sees per epoch.
        batch_size: Rows per batch.
        shuffle_buffer_rows: Ray Data local shuffle buffer size; None turns it off.
        collate_fn: Optional collate function (replaces Ray's tensor conversion).
        drop_last: Drop a final partial batch.
    """

    def __init__(
        self,
        shard: Any,
        rows: int,
        batch_size: int,
        shuffle_buffer_rows: int | None = None,
        collate_fn: Callable[[Any], Any] | None = None,
        drop_last: bool = False,
    ) -> None:
        self.shard = shard
        self.rows = rows
        self.batch_size = batch_size
        self.shuffle_buffer_rows = shuffle_buffer_rows
        self.collate_fn = collate_fn
        self.drop_last = drop_last

    def __len__(self) -> int:
        if self.drop_last:
            return self.rows // self.batch_size
        return math.ceil(self.rows / self.batch_size)

    def __iter__(self) -> Iterator[Any]:
        kwargs: dict[str, Any] = {
            "batch_size": self.batch_size,
            "local_shuffle_buffer_size": self.shuffle_buffer_rows,
            "drop_last": self.drop_last,
        }
        if self.collate_fn is not None:
            kwargs["collate_fn"] = self.collate_fn
        return iter(self.shard.iter_torch_batches(**kwargs))
