"""Value plumbing: task results and inputs written to storage and read back, and arguments
made ready for a task body (futures waited for, handles resolved).

The driver's run and the remote side of a call both use it, so it sits below both.
"""

from __future__ import annotations

import posixpath
from typing import Any

from michelangelo.uniflow.core import _builtin_io  # noqa: F401  (registers the built-in IOs)
from michelangelo.uniflow.core._io import io_named, write_value
from michelangelo.uniflow.core._storage import Storage

MISSING = object()  # what load_output returns for an output whose folder is gone


def persist_value(storage: Storage, call_dir: str, attempt: int, value: Any) -> tuple[dict, Any]:
    """Write one attempt's result atomically; return its output record and travelling value."""
    final = posixpath.join(call_dir, f"output-{attempt}")
    io, meta = write_value(storage, final, value)
    return ({"io": io.name, "folder": final, "meta": meta},
            io.travelling(value, storage, final, meta))


def load_output(storage: Storage, output: dict) -> Any:
    """The travelling value of a stored output, or ``MISSING`` if its folder is gone."""
    io = io_named(output["io"])
    folder = output["folder"]
    if not storage.exists(folder):
        return MISSING
    value = io.read(storage, folder, output["meta"])
    return io.travelling(value, storage, folder, output["meta"])


def read_value(storage: Storage, output: dict) -> Any:
    """The travelling value of a stored input or output (its folder must exist)."""
    io = io_named(output["io"])
    value = io.read(storage, output["folder"], output["meta"])
    return io.travelling(value, storage, output["folder"], output["meta"])


def resolve_futures(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Wait for the futures among a call's arguments (also inside lists, tuples and dicts)."""
    return tuple(_resolved(a) for a in args), {k: _resolved(v) for k, v in kwargs.items()}


def _resolved(value: Any) -> Any:
    if getattr(type(value), "__uniflow_future__", False):
        return value.result()
    if type(value) in (list, tuple):
        return type(value)(_resolved(v) for v in value)
    if type(value) is dict:
        return {k: _resolved(v) for k, v in value.items()}
    return value


def resolve_handles(hints: dict[str, Any], arguments: dict[str, Any]) -> dict[str, Any]:
    """Turn handles into what the task's annotations ask for (e.g. a Ray Dataset)."""
    resolved = {}
    for name, value in arguments.items():
        resolver = getattr(value, "uniflow_resolve", None)
        resolved[name] = resolver(hints.get(name)) if resolver else value
    return resolved
