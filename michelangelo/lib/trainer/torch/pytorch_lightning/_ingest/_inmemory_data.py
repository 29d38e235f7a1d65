"""In-memory ingest: a worker whose shard fits in memory reads it once and batches it itself.

Streaming every epoch through Ray Data costs a Ray Data executor, a prefetch thread, an
Arrow-to-tensor conversion per batch and a local shuffle buffer. When a worker's shard is
small next to its memory, none of that buys anything: the worker drains its shard once,
converts it to tensors once, and each epoch permutes the whole shard (a stronger shuffle
than a local buffer) and yields contiguous slices, as fast as a ``DataLoader`` over a
``TensorDataset``.

The choice is made on the driver, before any worker starts, from the dataset's known
in-memory size and the worker's memory; ``MA_TRAINER_INMEMORY`` forces it either way.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from michelangelo.lib.trainer.torch.pytorch_lightning._ingest._scaling import max_workers
from michelangelo.settings import (
    TRAINER_INMEMORY,
    TRAINER_INMEMORY_MAX_BYTES,
    TRAINER_INMEMORY_MEMORY_FRACTION,
)

logger = logging.getLogger(__name__)

__all__ = [
    "InMemoryBatches",
    "IngestPlan",
    "drain_blocks",
    "drain_shard",
    "plan_ingest",
    "shuffle_seed",
    "split_for_workers",
]


@dataclass(frozen=True)
class IngestPlan:
    """How workers read their data: ``in_memory`` or streaming, and why."""

    in_memory: bool
    reason: str
    # Row counts the decision already paid for (so the driver does not count twice).
    train_rows: int | None = None
    val_rows: int | None = None


def known_size_bytes(dataset: Any) -> int | None:
    """The dataset's in-memory size when Ray already knows it, without executing anything.

    ``Dataset.size_bytes()`` would execute a lazy dataset on the driver to find out, which
    is the very read the workers are about to do; only the plan's metadata is used here
    (exact for materialised datasets, Ray's estimate for file reads).
    """
    if dataset is None:
        return 0
    try:
        size = dataset._logical_plan.dag.infer_metadata().size_bytes
    except Exception:  # noqa: BLE001 - a private API; unknown is a valid answer
        return None
    return int(size) if size is not None else None


def fixed_row_bytes(dataset: Any) -> int | None:
    """Bytes per row when every column has a fixed width and the schema is known unread.

    File reads (``read_parquet``) know their schema from the footers but not their in-memory
    size; with fixed-width columns, rows x this width is that size.
    """
    try:
        schema = dataset.schema(fetch_if_missing=False)
    except Exception:  # noqa: BLE001 - unknown is a valid answer
        return None
    base = getattr(schema, "base_schema", None)
    if base is None or not hasattr(base, "types"):
        return None
    total = 0
    for dtype in base.types:
        shape, scalar = getattr(dtype, "shape", None), getattr(dtype, "value_type", None)
        if shape is not None and scalar is not None:  # Ray's fixed-shape tensor columns
            if any(d is None or d < 0 for d in shape):
                return None
            count, dtype = math.prod(shape), scalar
        else:
            count = 1
        try:
            bits = dtype.bit_width
        except ValueError:  # strings, lists, nested: their size is unknown until read
            return None
        total += math.ceil(bits * count / 8)
    return total


def _estimate(dataset: Any) -> tuple[int | None, int | None, str]:
    """(bytes, rows counted here or None, how the size was known) without reading data."""
    if dataset is None:
        return 0, None, "none"
    size = known_size_bytes(dataset)
    if size is not None:
        return size, None, "metadata"
    width = fixed_row_bytes(dataset)
    if width is None:
        return None, None, "unknown"
    rows = dataset.count()  # the streaming path counts anyway; Parquet counts from footers
    return rows * width, rows, "rows x fixed row width"


def host_memory_per_worker(scaling_config: Any) -> tuple[int, str]:
    """Host bytes one worker may use, and where that number came from."""
    workers = max_workers(scaling_config)
    per_worker = (scaling_config.resources_per_worker or {}).get("memory")
    if per_worker:
        return int(per_worker), "ScalingConfig.resources_per_worker['memory']"
    from michelangelo.uniflow.plugins.ray import current_ray_task

    task = current_ray_task()
    if task is not None and task.parsed("worker_memory") is not None:
        per_node = math.ceil(workers / max(task.worker_instances, 1))
        return (int(task.parsed("worker_memory")) // per_node,
                f"RayTask worker_memory / {per_node} worker(s) per node")
    node_memory = _smallest_live_node_memory()
    if node_memory is not None:
        return node_memory // workers, f"smallest Ray node's memory / {workers} worker(s)"
    import psutil

    return (psutil.virtual_memory().total // workers,
            f"this host's memory / {workers} worker(s)")


def _smallest_live_node_memory() -> int | None:
    import ray

    if not ray.is_initialized():
        return None
    try:
        sizes = [n["Resources"].get("memory") for n in ray.nodes() if n.get("Alive")]
    except Exception:  # noqa: BLE001 - then fall back to this host
        return None
    sizes = [int(s) for s in sizes if s]
    return min(sizes) if sizes else None


def plan_ingest(train_data: Any, val_data: Any, scaling_config: Any) -> IngestPlan:
    """Decide, on the driver, whether workers keep their shards in memory.

    Raises:
        ValueError: ``MA_TRAINER_INMEMORY`` or ``MA_TRAINER_INMEMORY_MAX_BYTES`` is invalid.
    """
    switch = TRAINER_INMEMORY.read()
    max_bytes = TRAINER_INMEMORY_MAX_BYTES.read()
    if switch == "0":
        return IngestPlan(False, f"streaming: {TRAINER_INMEMORY.name}=0")
    if switch == "1":
        return IngestPlan(True, f"in memory: {TRAINER_INMEMORY.name}=1")
    train_size, train_rows, how = _estimate(train_data)
    val_size, val_rows, val_how = _estimate(val_data)
    if train_size is None or val_size is None:
        return IngestPlan(False, "streaming: the dataset's size is unknown before it is read "
                          f"(set {TRAINER_INMEMORY.name}=1 to keep shards in memory anyway)",
                          train_rows, val_rows)
    workers = max_workers(scaling_config)
    # Every worker holds 1/world of each dataset (streaming_split(equal=True)).
    shard = math.ceil((train_size + val_size) / workers)
    if max_bytes is not None:
        limit, source = max_bytes, TRAINER_INMEMORY_MAX_BYTES.name
    else:
        memory, source = host_memory_per_worker(scaling_config)
        fraction = TRAINER_INMEMORY_MEMORY_FRACTION
        limit, source = int(memory * fraction), f"{fraction:.0%} of {source}"
    fits = shard <= limit
    estimated = " (estimated: rows x fixed row width)" if "rows" in how + val_how else ""
    reason = (f"{'in memory' if fits else 'streaming'}: shard of {shard:,} bytes per worker"
              f"{estimated} {'<=' if fits else '>'} {limit:,} bytes ({source})")
    return IngestPlan(fits, reason, train_rows, val_rows)


def shuffle_seed(experiment_dir: str | None) -> int:
    """The base seed of the per-epoch shuffles.

    ``PL_GLOBAL_SEED`` (set by ``seed_everything``) wins; else a named run derives it from its
    ``<storage_path>/<name>`` so a resumed run replays the same epoch orders; else random.
    """
    seed = os.environ.get("PL_GLOBAL_SEED")
    if seed is not None and seed.strip().lstrip("-").isdigit():
        return int(seed) % 2**63
    if experiment_dir:
        return int.from_bytes(hashlib.blake2b(experiment_dir.encode(), digest_size=8).digest(),
                              "little") % 2**63
    return random.SystemRandom().randrange(2**63)


def _one_table(tables: list[Any]) -> Any:
    import pyarrow as pa

    tables = [t for t in tables if t.num_rows]
    if not tables:
        return pa.table({})
    return pa.concat_tables(tables, promote_options="default").combine_chunks()


def drain_shard(shard: Any) -> Any:
    """Read a worker's whole shard (a ``ray.data.DataIterator``) once, as one Arrow table."""
    return _one_table(list(shard.iter_batches(batch_size=None, batch_format="pyarrow",
                                              prefetch_batches=1)))


def split_for_workers(datasets: dict[str, Any], workers: int) -> dict[str, list[list[Any]]]:
    """Split each dataset on the driver into ``workers`` equal parts of block references.

    The same split Ray Train would make (``equal=True``: every worker gets as many rows, the
    remainder is dropped), but materialised once here, so no split-coordinator actor has to
    start and every worker fetches its blocks straight from the object store.

    Returns:
        ``{name: [block refs of rank 0, of rank 1, ...]}``.
    """
    out = {}
    for name, dataset in datasets.items():
        parts = dataset.split(workers, equal=True)
        out[name] = [[ref for bundle in part.iter_internal_ref_bundles()
                      for ref in bundle.block_refs] for part in parts]
    return out


def drain_blocks(refs: list[Any]) -> Any:
    """A worker's blocks (from :func:`split_for_workers`) fetched once, as one Arrow table."""
    import ray
    from ray.data.block import BlockAccessor

    return _one_table([BlockAccessor.for_block(block).to_arrow() for block in ray.get(refs)])


def _batch_kind(collate_fn: Callable[[Any], Any] | None) -> str:
    """The batch format ``iter_torch_batches`` would hand ``collate_fn`` (same rules)."""
    if collate_fn is None:
        return "tensors"
    from ray.data.collate_fn import ArrowBatchCollateFn, PandasBatchCollateFn

    if isinstance(collate_fn, ArrowBatchCollateFn):
        return "pyarrow"
    if isinstance(collate_fn, PandasBatchCollateFn):
        return "pandas"
    return "numpy"  # NumpyBatchCollateFn and plain callables


class _EpochSampler:
    """What Lightning calls ``set_epoch`` on at the start of every epoch (resume included)."""

    def __init__(self) -> None:
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)


class _BatchShape:
    """The batch sampler a loader shows: Lightning reads its ``sampler`` (is the loader
    shuffled?) and DeepSpeed its ``batch_size`` (the micro batch size); batches come from the
    loader itself."""

    def __init__(self, batch_size: int, sampler: _EpochSampler) -> None:
        self.batch_size = batch_size
        self.sampler = sampler


class InMemoryBatches:
    """One worker's shard held in memory, batched and fully shuffled per epoch.

    Lightning calls ``sampler.set_epoch(epoch)`` before each epoch, with the epoch restored
    from a checkpoint on resume, and the order of epoch ``e`` is a pure function of
    ``(seed, rank, e)``; so a resumed run sees the same batches an uninterrupted one would.

    Args:
        table: The shard as a ``pyarrow.Table`` (see :func:`drain_shard`).
        batch_size: Rows per batch.
        shuffle: Permute the rows each epoch; False keeps the shard's order.
        seed: Base seed (:func:`shuffle_seed`).
        rank: This worker's rank (each shard gets its own order).
        collate_fn: Optional collate function; it receives what ``iter_torch_batches`` would
            give it (a dict of numpy arrays, an Arrow table or a DataFrame, by its class).
        drop_last: Drop a final partial batch.
        pin_memory: Pin the host tensors (for faster copies to a GPU).
    """

    def __init__(
        self,
        table: Any,
        batch_size: int,
        shuffle: bool,
        seed: int = 0,
        rank: int = 0,
        collate_fn: Callable[[Any], Any] | None = None,
        drop_last: bool = False,
        pin_memory: bool = False,
    ) -> None:
        self.rows = table.num_rows
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.rank = rank
        self.collate_fn = collate_fn
        self.drop_last = drop_last
        self.pin_memory = pin_memory
        self.sampler = _EpochSampler()
        # Lightning looks for both on any loader (shuffle warnings, set_epoch), and DeepSpeed
        # reads the micro batch size from the batch sampler.
        self.batch_sampler = _BatchShape(batch_size, self.sampler)
        self._kind = _batch_kind(collate_fn)
        self._data = self._convert(table)

    def _convert(self, table: Any) -> Any:
        if self._kind == "pyarrow":
            return table
        if self._kind == "pandas":
            return table.to_pandas()
        from ray.data.block import BlockAccessor

        numpy = BlockAccessor.for_block(table).to_batch_format("numpy") if self.rows else {}
        if self._kind == "numpy":
            return numpy
        from ray.data.util.torch_utils import convert_ndarray_batch_to_torch_tensor_batch

        # The same conversion Ray's default collate applies per batch, done once.
        tensors = {k: convert_ndarray_batch_to_torch_tensor_batch(v) for k, v in numpy.items()}
        if self.pin_memory and not self.shuffle:
            tensors = {k: v.pin_memory() for k, v in tensors.items()}
        return tensors

    def __len__(self) -> int:
        if self.drop_last:
            return self.rows // self.batch_size
        return math.ceil(self.rows / self.batch_size)

    def epoch_order(self, epoch: int) -> Any:
        """Row order of ``epoch``: a permutation of ``range(rows)``, or None (shard order)."""
        if not self.shuffle:
            return None
        import numpy as np

        return np.random.default_rng([self.seed, self.rank, epoch]).permutation(self.rows)

    def __iter__(self) -> Iterator[Any]:
        data = self._permuted(self.epoch_order(self.sampler.epoch))
        stop = len(self) * self.batch_size
        for start in range(0, min(stop, self.rows), self.batch_size):
            batch = self._slice(data, start, start + self.batch_size)
            yield batch if self.collate_fn is None else self.collate_fn(batch)

    def _permuted(self, order: Any) -> Any:
        if order is None:
            return self._data
        if self._kind == "pyarrow":
            return self._data.take(order)
        if self._kind == "pandas":
            return self._data.iloc[order]
        if self._kind == "numpy":
            return {k: v[order] for k, v in self._data.items()}
        return self._permute_tensors(order)

    def _permute_tensors(self, order: Any) -> dict[str, Any]:
        import torch

        index = torch.from_numpy(order)
        permuted = {}
        for key, value in self._data.items():
            # A fresh tensor per epoch: batches a caller kept from the last epoch stay intact.
            out = torch.empty_like(value, pin_memory=self.pin_memory)
            permuted[key] = torch.index_select(value, 0, index, out=out)
        return permuted

    def _slice(self, data: Any, start: int, stop: int) -> Any:
        if self._kind == "pyarrow":
            return data.slice(start, stop - start)
        if self._kind == "pandas":
            return data.iloc[start:stop].reset_index(drop=True)
        return {k: v[start:stop] for k, v in data.items()}
