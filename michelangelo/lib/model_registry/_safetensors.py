"""State dicts to and from safetensors bytes, with tied tensors kept tied.

safetensors refuses tensors that share memory. A tied pair (``decoder.weight is
embedding.weight``) is stored once; the other names are recorded in the file's metadata
under ``michelangelo.shared`` and point at the same tensor again after loading. Views that
only partly overlap (a slice of another tensor) are rare in state dicts; they are stored as
copies, which keeps the values right.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
import struct
from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["decode", "encode", "read_header", "sha256_of", "shapes_of"]

_SHARED_KEY = "michelangelo.shared"
_HASH_CHUNK = 64 << 20


def _identity(tensor: torch.Tensor) -> tuple[Any, ...]:
    return (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape),
            tuple(tensor.stride()), tensor.dtype)


def _prepare(state_dict: Mapping[str, Any], what: str) -> tuple[dict[str, torch.Tensor],
                                                               dict[str, str]]:
    tensors: dict[str, torch.Tensor] = {}
    shared: dict[str, str] = {}
    first_by_identity: dict[tuple[Any, ...], str] = {}
    keys_by_storage: dict[int, list[str]] = {}
    for key, value in state_dict.items():
        if not isinstance(key, str):
            raise ValueError(f"{what} key {key!r} is not a string. Fix: use a state dict "
                             "from module.state_dict().")
        if not isinstance(value, torch.Tensor):
            raise ValueError(
                f"{what}[{key!r}] is a {type(value).__name__}, not a torch.Tensor; only tensors "
                "are stored. Fix: drop non-tensor entries (e.g. extra state) before registering."
            )
        tensor = value.detach()
        if tensor.device.type != "cpu":
            tensor = tensor.cpu()
        if tensor.numel() and tensor.untyped_storage().size():
            identity = _identity(tensor)
            if identity in first_by_identity:
                shared[key] = first_by_identity[identity]
                continue
            first_by_identity[identity] = key
            keys_by_storage.setdefault(identity[0], []).append(key)
        tensors[key] = tensor
    for keys in keys_by_storage.values():
        if len(keys) > 1:  # distinct views of one storage: safetensors needs separate copies
            for key in keys:
                tensors[key] = tensors[key].clone()
    for key, tensor in tensors.items():
        if not tensor.is_contiguous():
            tensors[key] = tensor.contiguous()
    return tensors, shared


def encode(state_dict: Mapping[str, Any], what: str = "state_dict") -> bytes:
    """Serialise ``state_dict`` (tensors only) to safetensors bytes.

    Args:
        state_dict: Names to tensors, on any device.
        what: How the caller calls the dict, for error messages.

    Raises:
        ValueError: A key is not a string or a value is not a tensor.
    """
    from safetensors.torch import save

    tensors, shared = _prepare(state_dict, what)
    metadata = {_SHARED_KEY: json.dumps(shared)} if shared else None
    return save(tensors, metadata=metadata)


def decode(data: bytes) -> dict[str, torch.Tensor]:
    """Rebuild the state dict from :func:`encode` output, re-tying shared names, in key order."""
    from safetensors.torch import load

    tensors = load(data)
    shared = json.loads(read_header(data).get("__metadata__", {}).get(_SHARED_KEY, "{}"))
    for key, target in shared.items():
        tensors[key] = tensors[target]
    return tensors


def read_header(data: bytes) -> dict[str, Any]:
    """The JSON header of a safetensors file (names, dtypes, shapes, metadata) from its head.

    Only the first ``8 + header length`` bytes are needed, so callers can read just those.
    """
    if len(data) < 8:
        raise ValueError("not a safetensors file: shorter than 8 bytes")
    (length,) = struct.unpack("<Q", data[:8])
    if length > 100 << 20 or len(data) < 8 + length:
        raise ValueError(f"not a safetensors file (or truncated): header length {length}")
    return json.loads(bytes(data[8 : 8 + length]))


def shapes_of(header: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every name in a safetensors header (shared names included) with its shape."""
    out = {k: tuple(v["shape"]) for k, v in header.items() if k != "__metadata__"}
    shared = json.loads(header.get("__metadata__", {}).get(_SHARED_KEY, "{}"))
    out.update({key: out[target] for key, target in shared.items() if target in out})
    return out


def _sha256(data: bytes | memoryview) -> str:
    digest = hashlib.sha256()
    view = memoryview(data)
    for start in range(0, len(view), _HASH_CHUNK):
        digest.update(view[start : start + _HASH_CHUNK])
    return digest.hexdigest()


_POOL: concurrent.futures.ThreadPoolExecutor | None = None


def _forget_pool() -> None:
    # A forked child inherits the executor object but not its thread; start a fresh one.
    global _POOL
    _POOL = None


os.register_at_fork(after_in_child=_forget_pool)


def sha256_of(data: bytes | memoryview) -> concurrent.futures.Future[str]:
    """Start hashing ``data`` on a helper thread (hashlib drops the GIL), return the future.

    Hashing overlaps the caller's write or decode of the same bytes, so the integrity check
    costs little wall time on large weights.
    """
    global _POOL
    if _POOL is None:
        _POOL = concurrent.futures.ThreadPoolExecutor(max_workers=1,
                                                      thread_name_prefix="ma-sha256")
    return _POOL.submit(_sha256, data)
