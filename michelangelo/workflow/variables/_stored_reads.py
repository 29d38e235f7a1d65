"""How a stored dataset's Parquet files are read back.

A small dataset (at most ``MA_DATASET_DRIVER_READ_MAX_BYTES`` of Parquet, 32 MiB unless set;
0 turns this off) is read by the calling process with pyarrow and handed to Ray Data as one
in-memory table: no listing actor, no read tasks, and a dataset that knows its rows and size
without executing anything. Through
``ray.data.read_parquet`` the quickstart's two datasets cost a footer-reader process and read
tasks each, about 1.5 to 3 s per dataset on the 2-core test machine, against milliseconds here.
A larger dataset is read by Ray Data, in parallel, as before.
"""

from __future__ import annotations

from typing import Any

from michelangelo.settings import DRIVER_READ_MAX_BYTES
from michelangelo.workflow.variables._footer_readers import with_footer_readers


def read_table(fs: Any, files: list[str]) -> Any:
    """The files as one pyarrow ``Table``, in order."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    tables = [pq.read_table(f, filesystem=_arrow_fs(fs)) for f in files]
    return pa.concat_tables(tables) if tables else pa.table({})


def read_ray_dataset(path: str, fs: Any, sizes: dict[str, int]) -> Any:
    """The files under ``path`` as a ``ray.data.Dataset``: in memory when small, else read by
    Ray Data.

    Args:
        sizes: Each Parquet file's size in bytes, in path order (from the listing).
    """
    import ray.data

    limit = DRIVER_READ_MAX_BYTES.read()
    if limit and sum(sizes.values()) <= limit:
        return ray.data.from_arrow(read_table(fs, list(sizes)))
    return with_footer_readers(len(sizes), lambda: ray.data.read_parquet(path))


def _arrow_fs(fs: Any) -> Any:
    import pyarrow.fs as pafs
    from fsspec.implementations.local import LocalFileSystem

    if isinstance(fs, LocalFileSystem):
        return pafs.LocalFileSystem()
    return pafs.PyFileSystem(pafs.FSSpecHandler(fs))
