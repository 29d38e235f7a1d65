"""The IO registry: how each type of task result is written, read and fingerprinted.

A new type joins by subclassing :class:`ValueIO` and calling :func:`register_io`; the core
only ever asks the registry. Entries registered later are consulted first, so plugins can
specialise a type the built-ins already cover.
"""

from __future__ import annotations

from typing import Any, ClassVar

from michelangelo.uniflow.core._storage import Storage


class ValueIO:
    """How one family of values is persisted.

    Subclasses set ``name`` (stored in run records) and implement the four methods.
    """

    name: ClassVar[str] = ""

    def accepts(self, value: Any) -> bool:
        raise NotImplementedError

    def write(self, value: Any, storage: Storage, folder: str) -> dict:
        """Write ``value`` into ``folder`` (a fresh staging folder); return JSON-able metadata.

        The metadata may carry ``"fingerprint"`` (content hash) and ``"summary"`` (short text).
        """
        raise NotImplementedError

    def read(self, storage: Storage, folder: str, meta: dict) -> Any:
        """Load a value written by :meth:`write` from its published ``folder``."""
        raise NotImplementedError

    def fingerprint(self, value: Any) -> str | None:
        """A content hash of an in-memory value, or None when it cannot be had cheaply."""
        return None

    def travelling(self, value: Any, storage: Storage, folder: str, meta: dict) -> Any:
        """What the workflow receives after the value is persisted (default: the value)."""
        return value


_REGISTRY: list[ValueIO] = []


def register_io(io: ValueIO) -> ValueIO:
    """Add ``io`` to the registry; it takes precedence over earlier entries."""
    _REGISTRY.insert(0, io)
    return io


def io_for(value: Any) -> ValueIO:
    for io in _REGISTRY:
        if io.accepts(value):
            return io
    raise LookupError(f"no uniflow IO accepts a value of type {type(value).__name__}")


def io_named(name: str) -> ValueIO:
    for io in _REGISTRY:
        if io.name == name:
            return io
    raise LookupError(
        f"no uniflow IO named {name!r} is registered; import the package that provides it"
    )


def write_value(storage: Storage, final: str, value: Any) -> tuple[Any, dict]:
    """Write ``value`` through its IO to a staging folder, then publish it at ``final``.

    Returns the IO and its metadata; nothing is left at ``final`` when the write fails.
    """
    io = io_for(value)
    staging = storage.staging_dir(final)
    try:
        meta = io.write(value, storage, staging)
        storage.publish(staging, final)
    except BaseException:
        storage.remove(staging)
        raise
    return io, meta
