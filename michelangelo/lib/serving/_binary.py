"""The Open Inference Protocol's binary tensor extension, and the bytes an answer goes out as.

A request may carry tensors as raw bytes after its JSON header: the header
``Inference-Header-Content-Length: N`` says the first ``N`` bytes of the body are the JSON,
and every input with ``parameters.binary_data_size`` takes that many of the remaining bytes,
in order, little-endian and row-major (``BOOL`` one byte per value, ``BF16`` the upper two
bytes of a float32, ``BYTES`` each element as a 4-byte little-endian length and its bytes). Answers do the same for outputs asked for in binary (the request's
``parameters.binary_data_output`` or an output's ``parameters.binary_data``).

Every JSON answer is strict JSON: NaN and infinities never leave as bare tokens.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from michelangelo.lib.serving._errors import BadRequest, PayloadTooLarge

HEADER_LENGTH = "inference-header-content-length"
# Bytes per value on the wire, and the dtype the bytes are read as (little-endian).
_WIRE: dict[str, np.dtype] = {
    "BOOL": np.dtype("u1"), "UINT8": np.dtype("u1"), "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"), "UINT64": np.dtype("<u8"), "INT8": np.dtype("i1"),
    "INT16": np.dtype("<i2"), "INT32": np.dtype("<i4"), "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"), "BF16": np.dtype("<u2"), "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
}


async def read_body(request: Any, limit: int) -> bytes:
    """A Starlette request's body, refused with 413 as soon as it passes ``limit`` bytes."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge.over(int(declared), limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge.over(size, limit)
        chunks.append(chunk)
    return b"".join(chunks)


def split_body(raw: bytes, header_length: str | None) -> tuple[Any, bytes]:
    """The JSON header (parsed) and the binary tail of a request body."""
    if header_length is None:
        return parse_json(raw), b""
    if not header_length.strip().isdigit() or int(header_length) > len(raw):
        raise BadRequest(
            f"Inference-Header-Content-Length is {header_length!r}, but the body has "
            f"{len(raw)} bytes. Fix: send the byte length of the JSON header that starts the "
            "body.")
    size = int(header_length)
    return parse_json(raw[:size]), raw[size:]


def parse_json(raw: bytes) -> Any:
    """A request's JSON, or :class:`BadRequest` saying why it is not JSON."""
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"the body is not valid JSON ({exc}). Fix: send a JSON object, e.g. "
                         '{"inputs": [[0.1, 0.2]]}, with Content-Type: application/json.'
                         ) from None


class BinaryReader:
    """Hands out the binary tail of a request, tensor by tensor, in order."""

    def __init__(self, tail: bytes) -> None:
        self._tail = memoryview(tail)
        self._offset = 0

    def take(self, name: str, size: Any) -> memoryview:
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise BadRequest(f"input {name!r}: parameters.binary_data_size must be a "
                             f"non-negative integer, got {size!r}.")
        end = self._offset + size
        if end > len(self._tail):
            raise BadRequest(
                f"input {name!r}: binary_data_size={size} but only "
                f"{len(self._tail) - self._offset} bytes of binary data are left after the JSON "
                "header. Fix: check Inference-Header-Content-Length and the tensors' sizes.")
        chunk = self._tail[self._offset:end]
        self._offset = end
        return chunk

    def finish(self) -> None:
        left = len(self._tail) - self._offset
        if left:
            raise BadRequest(
                f"{left} bytes of binary data follow the JSON header that no input claims "
                "(parameters.binary_data_size). Fix: check Inference-Header-Content-Length.")


def from_bytes(name: str, chunk: memoryview, datatype: str, shape: list[int]) -> np.ndarray:
    """Raw little-endian bytes as an array of ``datatype`` (``BF16`` widened to float32)."""
    count = int(np.prod(shape)) if shape else 1
    if datatype == "BYTES":
        return _split_elements(name, bytes(chunk), count).reshape(shape)
    wire = _WIRE[datatype]
    if len(chunk) != count * wire.itemsize:
        raise BadRequest(
            f"input {name!r}: shape {shape} of {datatype} needs {count * wire.itemsize} bytes "
            f"({wire.itemsize} per value), but binary_data_size is {len(chunk)}. Fix: send "
            "the tensor's raw bytes, row-major.")
    raw = np.frombuffer(chunk, dtype=wire)
    if datatype == "BOOL":
        if raw.size and raw.max() > 1:
            raise BadRequest(f"input {name!r}: BOOL values must be bytes 0 or 1, got "
                             f"{int(raw.max())}.")
        array = raw.astype(np.bool_)
    elif datatype == "BF16":
        array = (raw.astype(np.uint32) << 16).view(np.float32)
    else:
        array = raw.astype(wire.newbyteorder("="), copy=True)  # native order, writable
    return array.reshape(shape)


def _split_elements(name: str, raw: bytes, count: int) -> np.ndarray:
    """A BYTES tensor's wire form (length-prefixed elements) as an object array."""
    out = np.empty(count, dtype=object)
    offset = 0
    for i in range(count):
        if offset + 4 > len(raw):
            raise BadRequest(
                f"input {name!r}: BYTES data ends after {i} of {count} elements. Fix: send "
                "each element as a 4-byte little-endian length followed by its bytes.")
        size = int.from_bytes(raw[offset:offset + 4], "little")
        offset += 4
        if offset + size > len(raw):
            raise BadRequest(
                f"input {name!r}: BYTES element {i} says {size} bytes, but only "
                f"{len(raw) - offset} are left. Fix: check each element's 4-byte length.")
        out[i] = raw[offset:offset + size]
        offset += size
    if offset != len(raw):
        raise BadRequest(
            f"input {name!r}: {len(raw) - offset} bytes follow the {count} BYTES elements "
            "its shape holds. Fix: make 'shape' match the number of elements.")
    return out


def _join_elements(array: np.ndarray) -> bytes:
    parts = []
    for value in array.reshape(-1):
        item = value.encode("utf-8") if isinstance(value, str) else bytes(value)
        parts += [len(item).to_bytes(4, "little"), item]
    return b"".join(parts)


def to_bytes(array: np.ndarray, datatype: str) -> bytes:
    """``array`` as the wire bytes of ``datatype``."""
    if datatype == "BYTES":
        return _join_elements(array)
    return np.ascontiguousarray(array, dtype=_WIRE[datatype] if datatype != "BOOL"
                                else np.uint8).tobytes()


def render(body: Any, tail: bytes = b"") -> tuple[bytes, dict[str, str]]:
    """An answer's bytes and headers: strict JSON, then the binary outputs if any."""
    header = strict_json(body)
    if not tail:
        return header, {"content-type": "application/json"}
    return header + tail, {"content-type": "application/octet-stream",
                           "inference-header-content-length": str(len(header))}


def strict_json(body: Any) -> bytes:
    """``body`` as JSON that every parser accepts (NaN and infinities are refused)."""
    return json.dumps(body, allow_nan=False, separators=(",", ":")).encode()
