"""How a worker reads its shard: Ray Data streaming, or the whole shard held in memory.

The driver plans the ingest (``plan_ingest``: does a worker's shard fit in memory, and how
the dataset splits across workers); a worker iterates either Ray Data batches that know their
length (``SizedBatches``) or its own in-memory batches (``InMemoryBatches``). ``max_workers``
is how many workers a ``ScalingConfig`` can start, which every split divides by.
"""

from michelangelo.lib.trainer.torch.pytorch_lightning._ingest._data import (
    PREFETCH_BATCHES,
    SizedBatches,
    rows_per_worker,
)
from michelangelo.lib.trainer.torch.pytorch_lightning._ingest._inmemory_data import (
    IngestPlan,
    InMemoryBatches,
    drain_blocks,
    drain_shard,
    plan_ingest,
    shuffle_seed,
    split_for_workers,
)
from michelangelo.lib.trainer.torch.pytorch_lightning._ingest._scaling import max_workers

__all__ = [
    "PREFETCH_BATCHES",
    "InMemoryBatches",
    "IngestPlan",
    "SizedBatches",
    "drain_blocks",
    "drain_shard",
    "max_workers",
    "plan_ingest",
    "rows_per_worker",
    "shuffle_seed",
    "split_for_workers",
]
