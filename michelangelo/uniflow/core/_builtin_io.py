"""Built-in IOs: JSON-able values, pandas frames, torch tensors, and a pickle fallback."""

from __future__ import annotations

import hashlib
import json
import posixpath
import sys
from typing import Any

import cloudpickle

from michelangelo.uniflow.core._fingerprint import value_fingerprint
from michelangelo.uniflow.core._io import ValueIO, io_for, io_named, register_io
from michelangelo.uniflow.core._storage import Storage


def _sha(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


class PickleIO(ValueIO):
    """Anything cloudpickle can serialise; the fallback of last resort."""

    name = "pickle"

    def accepts(self, value: Any) -> bool:
        return True

    def write(self, value: Any, storage: Storage, folder: str) -> dict:
        data = cloudpickle.dumps(value)
        storage.write_bytes(posixpath.join(folder, "value.pkl"), data)
        return {"fingerprint": _sha(data), "summary": type(value).__name__}

    def read(self, storage: Storage, folder: str, meta: dict) -> Any:
        return cloudpickle.loads(storage.read_bytes(posixpath.join(folder, "value.pkl")))

    def fingerprint(self, value: Any) -> str | None:
        try:
            return _sha(cloudpickle.dumps(value))
        except Exception:  # an unpicklable input simply cannot be cached on
            return None


def _is_jsonable(value: Any, depth: int = 0) -> bool:
    if depth > 50:
        return False
    if value is None or isinstance(value, (bool, int, str)):
        return True
    if isinstance(value, float):
        return value == value and value not in (float("inf"), float("-inf"))
    if isinstance(value, list):
        return all(_is_jsonable(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_jsonable(v, depth + 1) for k, v in value.items())
    return False


def _json_summary(value: Any, width: int = 80) -> str:
    """A short, whole description: a dict by its keys, a list by its length, else its repr.

    A repr cut at ``width`` would end mid-value (an absolute path, say); a dict's keys say
    what the task returned, and ``runs show`` points to the stored value for the rest.
    """
    if isinstance(value, dict):
        text = f"dict: {', '.join(value)}" if value else "dict (empty)"
    elif isinstance(value, list):
        text = f"list of {len(value)}"
    else:
        text = repr(value)
    return text if len(text) <= width else text[: width - 1] + "\u2026"


class JsonIO(ValueIO):
    """None, numbers, strings, and lists/dicts of them: stored as readable JSON."""

    name = "json"

    def accepts(self, value: Any) -> bool:
        return _is_jsonable(value)

    def write(self, value: Any, storage: Storage, folder: str) -> dict:
        data = json.dumps(value, sort_keys=True).encode()
        storage.write_bytes(posixpath.join(folder, "value.json"), data)
        return {"fingerprint": _sha(data), "summary": _json_summary(value)}

    def read(self, storage: Storage, folder: str, meta: dict) -> Any:
        return json.loads(storage.read_bytes(posixpath.join(folder, "value.json")))

    def fingerprint(self, value: Any) -> str | None:
        return _sha(json.dumps(value, sort_keys=True).encode())


class PandasIO(ValueIO):
    """pandas DataFrames, stored as one Parquet file."""

    name = "pandas"

    def accepts(self, value: Any) -> bool:
        pd = sys.modules.get("pandas")
        return pd is not None and isinstance(value, pd.DataFrame)

    def write(self, value: Any, storage: Storage, folder: str) -> dict:
        path = posixpath.join(folder, "data.parquet")
        with storage.fs.open(path, "wb") as handle:
            value.to_parquet(handle)
        return {
            "fingerprint": self.fingerprint(value),
            "summary": f"DataFrame {value.shape[0]} rows x {value.shape[1]} cols",
        }

    def read(self, storage: Storage, folder: str, meta: dict) -> Any:
        import pandas as pd

        with storage.fs.open(posixpath.join(folder, "data.parquet"), "rb") as handle:
            return pd.read_parquet(handle)

    def fingerprint(self, value: Any) -> str | None:
        import pandas as pd

        hashed = pd.util.hash_pandas_object(value, index=True).values.tobytes()
        header = json.dumps([list(map(str, value.columns)), list(map(str, value.dtypes))])
        return _sha(header.encode() + hashed)


class TorchIO(ValueIO):
    """torch tensors and (nested) dicts of tensors such as state dicts: ``torch.save``."""

    name = "torch"

    def accepts(self, value: Any) -> bool:
        torch = sys.modules.get("torch")
        if torch is None:
            return False
        if isinstance(value, torch.Tensor):
            return True
        return (
            isinstance(value, dict)
            and bool(value)
            and all(isinstance(v, torch.Tensor) for v in value.values())
        )

    def write(self, value: Any, storage: Storage, folder: str) -> dict:
        import io

        import torch

        buffer = io.BytesIO()
        torch.save(value, buffer)
        data = buffer.getvalue()
        storage.write_bytes(posixpath.join(folder, "value.pt"), data)
        return {"fingerprint": self.fingerprint(value), "summary": _torch_summary(value)}

    def read(self, storage: Storage, folder: str, meta: dict) -> Any:
        import io

        import torch

        data = storage.read_bytes(posixpath.join(folder, "value.pt"))
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)

    def fingerprint(self, value: Any) -> str | None:
        import torch

        tensors = value.items() if isinstance(value, dict) else [("", value)]
        digest = hashlib.blake2b(digest_size=16)
        for key, tensor in tensors:
            t = tensor.detach().cpu().contiguous()
            digest.update(f"{key}|{t.dtype}|{tuple(t.shape)}".encode())
            digest.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        return digest.hexdigest()


class ContainerIO(ValueIO):
    """Tuples, lists and str-keyed dicts of other values: each item keeps its own IO.

    This is what lets a task return ``(train_dv, val_dv)`` and have both datasets stored
    as Parquet and handed on as handles.
    """

    name = "container"

    def accepts(self, value: Any) -> bool:
        if isinstance(value, dict):
            return all(isinstance(k, str) for k in value)
        return isinstance(value, (tuple, list))

    def _items(self, value: Any) -> list[tuple[str, Any]]:
        if isinstance(value, dict):
            return list(value.items())
        return [(str(i), v) for i, v in enumerate(value)]

    def write(self, value: Any, storage: Storage, folder: str) -> dict:
        items = []
        for index, (key, item) in enumerate(self._items(value)):
            io = io_for(item)
            sub = posixpath.join(folder, str(index))
            storage.makedirs(sub)
            items.append({"key": key, "io": io.name, "meta": io.write(item, storage, sub)})
        fps = [i["meta"].get("fingerprint") for i in items]
        return {
            "kind": type(value).__name__ if isinstance(value, (tuple, list)) else "dict",
            "items": items,
            "fingerprint": None if None in fps else _sha(json.dumps(fps).encode()),
            "summary": f"{type(value).__name__} of {len(items)}",
        }

    def _each(self, storage: Storage, folder: str, meta: dict, method: str) -> Any:
        values = []
        for index, item in enumerate(meta["items"]):
            io = io_named(item["io"])
            sub = posixpath.join(folder, str(index))
            loaded = io.read(storage, sub, item["meta"])
            if method == "travelling":
                loaded = io.travelling(loaded, storage, sub, item["meta"])
            values.append((item["key"], loaded))
        if meta["kind"] == "dict":
            return dict(values)
        out = [v for _, v in values]
        return tuple(out) if meta["kind"] == "tuple" else out

    def read(self, storage: Storage, folder: str, meta: dict) -> Any:
        return self._each(storage, folder, meta, "read")

    def travelling(self, value: Any, storage: Storage, folder: str, meta: dict) -> Any:
        return self._each(storage, folder, meta, "travelling")

    def fingerprint(self, value: Any) -> str | None:
        return value_fingerprint(value)


def _torch_summary(value: Any) -> str:
    if isinstance(value, dict):
        return f"{len(value)} tensors"
    return f"Tensor{tuple(value.shape)} {value.dtype}"


for _io in (PickleIO(), ContainerIO(), TorchIO(), PandasIO(), JsonIO()):
    register_io(_io)
