"""Ray Datasets and ``DatasetVariable`` results: written as Parquet, passed as handles."""

from __future__ import annotations

import hashlib
import posixpath
from typing import Any

from michelangelo.uniflow.core.plugin import Storage, ValueIO, register_io
from michelangelo.workflow.variables._dataset_variable import DatasetVariable, _kind
from michelangelo.workflow.variables._stored_writes import write_ray_dataset, write_tables

_CHUNK = 8 * 2**20


class DatasetIO(ValueIO):
    """Writes the data as Parquet (a large Ray Dataset in parallel on the cluster, with Ray
    Data) and records a content hash."""

    name = "dataset"

    def accepts(self, value: Any) -> bool:
        return isinstance(value, DatasetVariable) or _kind(value) == "ray"

    def write(self, value: Any, storage: Storage, folder: str) -> dict:
        if isinstance(value, DatasetVariable) and value.is_stored and value.value is None:
            # Already stored (e.g. passed through unchanged): record a reference, copy nothing.
            return {"path": value.path, "schema": value.schema, "num_rows": value.num_rows,
                    "fingerprint": value.fingerprint, "summary": _summary(value.num_rows),
                    "reference": True}
        data = value.value if isinstance(value, DatasetVariable) else value
        target = posixpath.join(folder, "data")
        storage.makedirs(target)
        kind = _kind(data)
        if kind == "ray":
            write_ray_dataset(data, storage, target)
        else:
            import pyarrow as pa

            table = data if kind == "arrow" else pa.Table.from_pandas(data, preserve_index=False)
            write_tables([table], storage, target)
        schema, rows, fingerprint = _describe(storage, target)
        return {"data": "data", "schema": schema, "num_rows": rows, "fingerprint": fingerprint,
                "summary": _summary(rows)}

    def read(self, storage: Storage, folder: str, meta: dict) -> Any:
        path = meta["path"] if meta.get("reference") else storage.url_of(
            posixpath.join(folder, meta["data"]))
        return DatasetVariable(path=path, schema=meta["schema"], num_rows=meta["num_rows"],
                               fingerprint=meta["fingerprint"])

    def travelling(self, value: Any, storage: Storage, folder: str, meta: dict) -> Any:
        return self.read(storage, folder, meta)

    def fingerprint(self, value: Any) -> str | None:
        if isinstance(value, DatasetVariable):
            return value.fingerprint
        return None  # an unstored Ray Dataset has no cheap content hash


def _describe(storage: Storage, target: str) -> tuple[str, int, str]:
    """Schema text, row count (from Parquet footers) and a content hash of the files."""
    import pyarrow.parquet as pq

    files = sorted(f for f in storage.fs.find(target) if f.endswith(".parquet"))
    rows = 0
    schema = ""
    digests = []
    for path in files:
        with storage.fs.open(path, "rb") as handle:
            digest = hashlib.blake2b(digest_size=16)
            while chunk := handle.read(_CHUNK):
                digest.update(chunk)
            handle.seek(0)
            meta = pq.ParquetFile(handle).metadata
            rows += meta.num_rows
            if not schema:
                schema = str(meta.schema.to_arrow_schema()).replace("\n", "; ")[:2000]
        digests.append(digest.hexdigest())
    # File names are random per write; hash the sorted per-file hashes so that identical
    # data written the same way has the same fingerprint.
    combined = hashlib.blake2b("".join(sorted(digests)).encode(), digest_size=16).hexdigest()
    return schema, rows, combined


def _summary(rows: int | None) -> str:
    return f"dataset, {rows} rows"


_registered: list[DatasetIO] = []


def register_dataset_io() -> DatasetIO:
    """Make uniflow store Ray Datasets, DataFrames and ``DatasetVariable`` results as Parquet.

    Registers :class:`DatasetIO` with uniflow's IO registry once; later calls return the same
    instance. This package calls it on import, and so does the Ray plugin, whose tasks return
    Ray Datasets.
    """
    if not _registered:
        _registered.append(register_io(DatasetIO()))
    return _registered[0]
