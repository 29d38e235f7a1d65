"""Fingerprints of code and inputs, the ingredients of cache and resume keys."""

from __future__ import annotations

import hashlib
import inspect
import json
import marshal
from collections.abc import Callable
from typing import Any

from michelangelo.uniflow.core._io import io_for


def code_fingerprint(fn: Callable) -> str:
    """Hash of a function's source (its bytecode when the source is not available)."""
    try:
        payload = inspect.getsource(fn).encode()
    except (OSError, TypeError):
        payload = marshal.dumps(fn.__code__)
    return hashlib.blake2b(payload, digest_size=16).hexdigest()


def value_fingerprint(value: Any) -> str | None:
    """Content hash of one input; handles (e.g. DatasetVariable) carry their own."""
    own = getattr(value, "uniflow_fingerprint", None)
    if own is not None:
        return own() if callable(own) else own
    if isinstance(value, (list, tuple)):
        parts = [value_fingerprint(v) for v in value]
        if any(p is None for p in parts):
            return None
        return _hash([type(value).__name__, *parts])
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        items = {k: value_fingerprint(v) for k, v in value.items()}
        if any(p is None for p in items.values()):
            return None
        return _hash(items)
    return io_for(value).fingerprint(value)


def inputs_fingerprint(arguments: dict[str, Any]) -> str | None:
    """Hash of a call's bound arguments, or None when any input cannot be fingerprinted."""
    parts = {}
    for name, value in arguments.items():
        fp = value_fingerprint(value)
        if fp is None:
            return None
        parts[name] = fp
    return _hash(parts)


def call_key(identity: str, code_fp: str, input_fp: str | None, version: str | None) -> str | None:
    if input_fp is None:
        return None
    return _hash([identity, code_fp, input_fp, version or ""])


def _hash(obj: Any) -> str:
    data = json.dumps(obj, sort_keys=True).encode()
    return hashlib.blake2b(data, digest_size=16).hexdigest()
