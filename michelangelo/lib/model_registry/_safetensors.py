"""State dicts to and from the safetensors format, streamed, with tied tensors kept tied.

The format is small and fixed (an 8-byte little-endian header length, a JSON header of
names, dtypes, shapes and byte ranges, then the raw tensor bytes), so it is written and
read here directly: tensors go to the file straight from their own memory and come back as
views of one buffer read once, with the sha256 computed on a helper thread over the same
bytes meanwhile. The ``safetensors`` library reads these files unchanged (and its files read
here), which the tests check.

safetensors has no notion of shared memory. A tied pair (``decoder.weight is
embedding.weight``) is stored once; the other names are recorded in the metadata under
``michelangelo.shared`` and point at the same tensor again after loading. Views that only
partly overlap (a slice of another tensor) are stored as copies, which keeps the values.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import io
import json
import mmap
import os
import struct
from collections.abc import Iterable, Mapping
from typing import IO, Any

import torch

from michelangelo.errors import InputError

__all__ = ["decode", "encode", "read_header", "read_state_dict", "shapes_of",
           "write_state_dict"]

_SHARED_KEY = "michelangelo.shared"
_DTYPES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
    torch.uint8: "U8", torch.bool: "BOOL",
}
for _name, _code in (("float8_e4m3fn", "F8_E4M3"), ("float8_e5m2", "F8_E5M2"),
                     ("uint16", "U16"), ("uint32", "U32"), ("uint64", "U64")):
    if hasattr(torch, _name):
        _DTYPES[getattr(torch, _name)] = _code
_BY_CODE = {code: dtype for dtype, code in _DTYPES.items()}


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
            raise InputError(f"{what} key {key!r} is not a string. Fix: use a state dict "
                             "from module.state_dict().")
        if not isinstance(value, torch.Tensor):
            raise InputError(
                f"{what}[{key!r}] is a {type(value).__name__}, not a torch.Tensor; only tensors "
                "are stored. Fix: drop non-tensor entries (e.g. extra state) before registering."
            )
        if value.dtype not in _DTYPES:
            raise InputError(f"{what}[{key!r}] has dtype {value.dtype}, which safetensors cannot "
                             f"store. Fix: convert it (e.g. .float()).")
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
        if len(keys) > 1:  # distinct views of one storage: each needs its own bytes
            for key in keys:
                tensors[key] = tensors[key].clone()
    return {k: t.contiguous() for k, t in tensors.items()}, shared


def _raw(tensor: torch.Tensor) -> memoryview:
    if tensor.numel() == 0:
        return memoryview(b"")
    return memoryview(tensor.reshape(-1).view(torch.uint8).numpy())


def _layout(state_dict: Mapping[str, Any], what: str
            ) -> tuple[bytes, list[memoryview], list[torch.Tensor]]:
    tensors, shared = _prepare(state_dict, what)
    # Larger elements first keeps every tensor aligned to its element size, so readers can
    # view the bytes in place (the safetensors library orders them the same way).
    order = sorted(tensors, key=lambda k: (-tensors[k].element_size(), k))
    header: dict[str, Any] = {}
    offset = 0
    for key in order:
        tensor = tensors[key]
        size = tensor.numel() * tensor.element_size()
        header[key] = {"dtype": _DTYPES[tensor.dtype], "shape": list(tensor.shape),
                       "data_offsets": [offset, offset + size]}
        offset += size
    if shared:
        header["__metadata__"] = {_SHARED_KEY: json.dumps(shared)}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    keep = [tensors[k] for k in order]  # the memoryviews borrow these tensors' memory
    return struct.pack("<Q", len(text)) + text, [_raw(t) for t in keep], keep


def _sha256(chunks: Iterable[memoryview | bytes]) -> str:
    digest = hashlib.sha256()
    for chunk in chunks:
        digest.update(chunk)
    return digest.hexdigest()


_POOL: concurrent.futures.ThreadPoolExecutor | None = None


def _forget_pool() -> None:
    # A forked child inherits the executor object but not its thread; start a fresh one.
    global _POOL
    _POOL = None


os.register_at_fork(after_in_child=_forget_pool)


def _in_background(fn: Any, *args: Any) -> concurrent.futures.Future[Any]:
    global _POOL
    if _POOL is None:
        _POOL = concurrent.futures.ThreadPoolExecutor(max_workers=1,
                                                      thread_name_prefix="ma-sha256")
    return _POOL.submit(fn, *args)


def write_state_dict(handle: IO[bytes], state_dict: Mapping[str, Any],
                     what: str = "state_dict") -> tuple[int, str]:
    """Write ``state_dict`` to ``handle`` in safetensors format.

    The sha256 is computed on a helper thread over the same memory while this thread writes
    (both release the GIL), so hashing adds little wall time.

    Returns:
        ``(bytes written, sha256 hex digest of them)``.

    Raises:
        ValueError: A key is not a string, a value is not a tensor or has an unsupported dtype.
    """
    head, chunks, _keep = _layout(state_dict, what)
    digest = _in_background(_sha256, [head, *chunks])
    handle.write(head)
    for chunk in chunks:
        handle.write(chunk)
    return len(head) + sum(len(c) for c in chunks), digest.result()


def encode(state_dict: Mapping[str, Any], what: str = "state_dict") -> bytes:
    """:func:`write_state_dict` into bytes (for small dicts)."""
    buffer = io.BytesIO()
    write_state_dict(buffer, state_dict, what)
    return buffer.getvalue()


def _head_bytes(raw: torch.Tensor) -> bytes:
    if len(raw) < 8:
        return raw.numpy().tobytes()
    (length,) = struct.unpack("<Q", raw[:8].numpy().tobytes())
    return raw[: 8 + min(length, len(raw) - 8)].numpy().tobytes()


def read_header(data: bytes | bytearray | memoryview) -> dict[str, Any]:
    """The JSON header of a safetensors file from its first ``8 + header length`` bytes."""
    if len(data) < 8:
        raise InputError("not a safetensors file: shorter than 8 bytes")
    (length,) = struct.unpack("<Q", bytes(data[:8]))
    if length > 100 << 20 or len(data) < 8 + length:
        raise InputError(f"not a safetensors file (or truncated): header length {length}")
    return json.loads(bytes(data[8 : 8 + length]))


def decode(buffer: bytearray | torch.Tensor) -> dict[str, torch.Tensor]:
    """Tensors viewing ``buffer`` (a whole safetensors file, not copied), shared names re-tied.

    Args:
        buffer: The file's bytes, as a ``bytearray`` or a 1-d ``torch.uint8`` tensor.

    Raises:
        ValueError: The buffer is not a well-formed safetensors file.
    """
    if isinstance(buffer, torch.Tensor):
        raw = buffer
    elif len(buffer):
        raw = torch.frombuffer(buffer, dtype=torch.uint8)
    else:
        raw = torch.empty(0, dtype=torch.uint8)
    header = read_header(_head_bytes(raw))
    base = 8 + struct.unpack("<Q", raw[:8].numpy().tobytes())[0]
    metadata = header.pop("__metadata__", None) or {}
    out: dict[str, torch.Tensor] = {}
    for key, entry in header.items():
        dtype = _BY_CODE.get(entry.get("dtype"))
        if dtype is None:
            raise InputError(f"tensor {key!r} has dtype {entry.get('dtype')!r}, unknown here")
        start, end = entry["data_offsets"]
        shape = entry["shape"]
        size = torch.empty((), dtype=dtype).element_size()
        count = 1
        for dim in shape:
            count *= dim
        if end - start != count * size or base + end > len(raw):
            raise InputError(f"tensor {key!r}: byte range {start}..{end} does not fit its "
                             f"shape {shape} or the file")
        if count == 0:
            out[key] = torch.empty(shape, dtype=dtype)
        elif (base + start) % size == 0:
            out[key] = raw[base + start : base + end].view(dtype).reshape(shape)
        else:  # misaligned (not written by us or the library): copy out
            out[key] = raw[base + start : base + end].clone().view(dtype).reshape(shape)
    for key, target in json.loads(metadata.get(_SHARED_KEY, "{}")).items():
        out[key] = out[target]
    return out


def read_state_dict(handle: IO[bytes], size: int) -> tuple[dict[str, torch.Tensor], str]:
    """Read a whole safetensors file of ``size`` bytes once; hash it while it is read.

    Returns:
        ``(tensors, sha256 hex digest of the bytes read)``. The digest is of what was read,
        so the caller can compare it with the recorded one before trusting the tensors.

    Raises:
        ValueError: The file is shorter than ``size`` or malformed.
    """
    # torch.empty: no zero-filling pass over memory the read overwrites anyway.
    buffer = torch.empty(size, dtype=torch.uint8)
    view = memoryview(buffer.numpy())
    digest = hashlib.sha256()
    pending: concurrent.futures.Future[Any] | None = None
    position, step = 0, 32 << 20
    while position < size:
        got = handle.readinto(view[position : position + step])
        if not got:
            raise InputError(f"file ended after {position} of {size} bytes")
        if pending is not None:
            pending.result()
        # Hash this chunk on the helper thread while the next one is read.
        pending = _in_background(digest.update, view[position : position + got])
        position += got
    if pending is not None:
        pending.result()
    return decode(buffer), digest.hexdigest()


def map_state_dict(path: str, size: int) -> tuple[dict[str, torch.Tensor], str]:
    """:func:`read_state_dict` for a file on local disk, without copying it.

    The file is memory-mapped copy-on-write: the tensors view the page cache's pages, one
    sha256 pass reads them, and writing to a tensor copies only the page written (the file
    never changes). Registry files are published once and never rewritten in place.
    """
    with open(path, "rb") as handle:
        if size == 0:
            raise InputError("file is empty")
        mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_COPY)
    if len(mapped) != size:
        raise InputError(f"file has {len(mapped)} bytes, recorded {size}")
    with contextlib.suppress(AttributeError, OSError):  # madvise: Linux and macOS
        mapped.madvise(mmap.MADV_SEQUENTIAL)
    digest = hashlib.sha256(mapped).hexdigest()
    # The tensor holds a reference to the mapping, which lives as long as any view of it.
    return decode(torch.frombuffer(mapped, dtype=torch.uint8)), digest


def shapes_of(header: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every name in a safetensors header (shared names included) with its shape."""
    out = {k: tuple(v["shape"]) for k, v in header.items() if k != "__metadata__"}
    shared = json.loads((header.get("__metadata__") or {}).get(_SHARED_KEY, "{}"))
    out.update({key: out[target] for key, target in shared.items() if target in out})
    return out


def sha256_of(data: bytes | bytearray | memoryview) -> str:
    """sha256 hex digest of ``data``."""
    return _sha256([memoryview(data)])
