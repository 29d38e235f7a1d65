"""``DatasetVariable``: a small handle to a dataset stored as Parquet."""

from __future__ import annotations

import posixpath
from typing import Any

from michelangelo.errors import InputError, InputTypeError
from michelangelo.workflow.variables._stored_reads import read_ray_dataset, read_table

_NOT_LOADED = object()


class DatasetVariable:
    """A dataset that travels between tasks as a handle: path, schema, rows, fingerprint.

    A task returns ``DatasetVariable.create(ds)`` (or a bare ``ray.data.Dataset``); uniflow
    writes the data as Parquet under the run's storage and hands the next task this handle.
    Pickling a handle never pickles the data. Load the data where it is needed with
    :meth:`load_ray_dataset` or :meth:`load_pandas_dataframe`; both also set :attr:`value`.
    """

    def __init__(
        self,
        value: Any = _NOT_LOADED,
        *,
        path: str | None = None,
        schema: str | None = None,
        num_rows: int | None = None,
        fingerprint: str | None = None,
    ) -> None:
        self._value = value
        self.path = path
        self.schema = schema
        self.num_rows = num_rows
        self.fingerprint = fingerprint

    @classmethod
    def create(cls, value: Any) -> DatasetVariable:
        """Wrap a ``ray.data.Dataset``, a pandas ``DataFrame`` or a pyarrow ``Table``.

        Raises:
            TypeError: For any other kind of value.
        """
        if not _is_supported(value):
            raise InputTypeError(
                f"DatasetVariable.create(value) got a {type(value).__module__}."
                f"{type(value).__name__}; pass a ray.data.Dataset, a pandas.DataFrame or a "
                "pyarrow.Table."
            )
        return cls(value)

    @property
    def value(self) -> Any:
        """The loaded dataset (after ``load_*`` or ``create``), else ``None``."""
        return None if self._value is _NOT_LOADED else self._value

    @property
    def is_stored(self) -> bool:
        return self.path is not None

    def load_ray_dataset(self) -> Any:
        """Read the stored Parquet files as a ``ray.data.Dataset`` and keep it in ``value``.

        A small dataset (``MA_DATASET_DRIVER_READ_MAX_BYTES``, 32 MiB of Parquet by default) is
        read here and handed to Ray Data in memory; a larger one is read by Ray Data's tasks.
        """
        if not self.is_stored:
            if self._value is _NOT_LOADED:
                raise InputError("DatasetVariable has neither stored data nor a value to load.")
            self._value = _to_ray(self._value)
            return self._value
        fs, sizes = self._stored_files()
        self._value = read_ray_dataset(self.path, fs, sizes)
        return self._value

    def load_pandas_dataframe(self) -> Any:
        """Read the stored Parquet files into a pandas ``DataFrame`` and keep it in ``value``."""
        if not self.is_stored:
            if self._value is _NOT_LOADED:
                raise InputError("DatasetVariable has neither stored data nor a value to load.")
            self._value = _to_pandas(self._value)
            return self._value
        fs, sizes = self._stored_files()
        self._value = read_table(fs, list(sizes)).to_pandas()
        return self._value

    def _stored_files(self) -> tuple[Any, dict[str, int]]:
        """The filesystem and the stored Parquet files with their sizes in bytes, in path
        order, from one listing; raises when there are none."""
        import fsspec

        fs, root = fsspec.core.url_to_fs(self.path)
        found = fs.find(root, detail=True) if fs.exists(root) else {}
        files = {f: int(found[f]["size"]) for f in sorted(found) if f.endswith(".parquet")}
        if not files:
            raise FileNotFoundError(
                f"DatasetVariable data is missing at {self.path!r} (expected Parquet files "
                "there). The run's storage was moved or deleted; rerun the task that produced "
                "it, or point UF_STORAGE_URL at the storage that holds it."
            )
        return fs, files

    # -- uniflow hooks ---------------------------------------------------------------------
    def uniflow_fingerprint(self) -> str | None:
        return self.fingerprint

    def uniflow_resolve(self, annotation: Any) -> Any:
        """Give a task the form its parameter annotation asks for."""
        if not isinstance(annotation, type):
            return self
        module = annotation.__module__
        if module.startswith("ray.data") and annotation.__name__.endswith("Dataset"):
            return self.load_ray_dataset()
        if module.startswith("pandas") and annotation.__name__ == "DataFrame":
            return self.load_pandas_dataframe()
        return self

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_value"] = _NOT_LOADED if self.is_stored else state["_value"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)

    def __repr__(self) -> str:
        if not self.is_stored:
            return f"DatasetVariable(value={type(self._value).__name__}, not stored yet)"
        return (
            f"DatasetVariable(path={self.path!r}, num_rows={self.num_rows}, "
            f"fingerprint={self.fingerprint!r})"
        )


def _is_supported(value: Any) -> bool:
    return _kind(value) is not None


def _kind(value: Any) -> str | None:
    """``"ray"``, ``"pandas"`` or ``"arrow"`` for the dataset types we store, else None."""
    import sys

    data = sys.modules.get("ray.data")
    if data is not None and isinstance(value, data.Dataset):
        return "ray"
    pd = sys.modules.get("pandas")
    if pd is not None and isinstance(value, pd.DataFrame):
        return "pandas"
    pa = sys.modules.get("pyarrow")
    if pa is not None and isinstance(value, pa.Table):
        return "arrow"
    return None


def _to_ray(value: Any) -> Any:
    import ray.data

    kind = _kind(value)
    if kind == "pandas":
        return ray.data.from_pandas(value)
    if kind == "arrow":
        return ray.data.from_arrow(value)
    return value


def _to_pandas(value: Any) -> Any:
    if _kind(value) in ("arrow", "ray"):
        return value.to_pandas()
    return value


def data_path(folder: str) -> str:
    return posixpath.join(folder, "data")
