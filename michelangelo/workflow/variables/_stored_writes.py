"""How a Ray Dataset result is written as Parquet.

A small dataset that is already materialized (at most ``MA_DATASET_DRIVER_WRITE_MAX_BYTES`` in
memory, 32 MiB unless set; 0 turns this off) is written by the calling process: its blocks
are fetched from the object store as Arrow tables and each is written with pyarrow, one file
per block in block order, as Ray Data lays them out. No write tasks are started; on the 2-core
test machine Ray Data's write of each of the quickstart's two small datasets took 1.3 to 1.9 s.
Anything else (a lazy dataset, or a larger one) is written by Ray Data, in parallel.
"""

from __future__ import annotations

import posixpath
from typing import Any

from michelangelo.settings import DRIVER_WRITE_MAX_BYTES


def write_ray_dataset(data: Any, storage: Any, target: str) -> None:
    """Write ``data`` (a ``ray.data.Dataset``) as Parquet files under ``target``."""
    tables = _small_blocks(data)
    if tables is None:
        data.write_parquet(storage.url_of(target))
    else:
        write_tables(tables, storage, target)


def write_tables(tables: list[Any], storage: Any, target: str) -> None:
    """Write each Arrow table as ``part-NNNNN.parquet`` under ``target``, in order."""
    import pyarrow.parquet as pq

    for index, table in enumerate(tables):
        with storage.fs.open(posixpath.join(target, f"part-{index:05d}.parquet"), "wb") as out:
            pq.write_table(table, out)


def _small_blocks(data: Any) -> list[Any] | None:
    """The dataset's blocks as Arrow tables (empty ones left out, unless all are) when it is
    materialized and small enough to pass through this process; None otherwise."""
    import ray
    from ray.data.dataset import MaterializedDataset

    limit = DRIVER_WRITE_MAX_BYTES.read()
    if not limit or not isinstance(data, MaterializedDataset):
        return None
    size = data.size_bytes()
    if size is None or size > limit:
        return None
    tables = ray.get(data.to_arrow_refs())
    kept = [table for table in tables if table.num_rows]
    return kept or tables[:1]
