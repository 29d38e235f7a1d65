"""How many footer-reading actors Ray Data starts to read a stored dataset's Parquet files.

Every ``ray.data.read_parquet`` lists its files by reading their footers on a pool of Ray
actors: 32 of them by default (``RAY_DATA_PARQUET_FOOTER_NUM_ACTORS``), each a new worker
process that imports Ray Data and pyarrow, and each asked for up to 10 files at a time. On a
laptop that pool costs more than the read itself: reading the quickstart's two datasets (three
small files each) took 8 to 13 s per read on the 2-core test machine, and 1.3 s with one actor.

A stored dataset knows its files, so it asks for one actor per 10 files, at most Ray's 32. Ray
Data reads the variable when the read is planned, on the calling process; it is set only for
that call, under a lock, and a value the user set is left alone. Ray Data's indexer module also
reads it once, as its default, when first imported: that import happens here before the
variable is set, so the process's own ``read_parquet`` calls keep Ray's default.
"""

from __future__ import annotations

import contextlib
import importlib
import math
import os
import threading
from collections.abc import Callable
from typing import TypeVar

ENV_VAR = "RAY_DATA_PARQUET_FOOTER_NUM_ACTORS"
FILES_PER_READER = 10  # Ray Data's footers per call (RAY_DATA_PARQUET_FOOTER_BATCH_SIZE)
MAX_READERS = 32  # Ray Data's own default pool
_INDEXER_MODULE = "ray.data._internal.datasource_v2.formats.parquet.footer_file_indexer"

_lock = threading.Lock()
T = TypeVar("T")


def readers_for(files: int) -> int:
    """Footer readers for ``files`` Parquet files: one per 10 files, 1 to 32."""
    return max(1, min(MAX_READERS, math.ceil(files / FILES_PER_READER)))


def with_footer_readers(files: int, read: Callable[[], T]) -> T:
    """Call ``read`` (a ``read_parquet``) with a footer-reader pool sized to ``files``."""
    with contextlib.suppress(ImportError):  # before the variable is set: see above
        importlib.import_module(_INDEXER_MODULE)
    with _lock:
        if ENV_VAR in os.environ:  # the user's own setting
            return read()
        os.environ[ENV_VAR] = str(readers_for(files))
        try:
            return read()
        finally:
            os.environ.pop(ENV_VAR, None)
