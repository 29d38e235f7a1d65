"""Just enough PNG decoding (8-bit RGB/RGBA, not interlaced) to count pixels in a test."""

from __future__ import annotations

import struct
import zlib

import numpy as np


def read_png(path: str) -> tuple[int, int, np.ndarray]:
    """``(width, height, pixels)``; ``pixels`` is a ``height x width x 3`` RGB array."""
    with open(path, "rb") as handle:
        data = handle.read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError(f"{path} is not a PNG file")
    pos, idat, header = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", chunk)
        elif kind == b"IDAT":
            idat += chunk
        elif kind == b"IEND":
            break
    assert header is not None, "no IHDR chunk"
    width, height, depth, colour, _, _, interlace = header
    if depth != 8 or colour not in (2, 6) or interlace:
        raise ValueError(f"unsupported PNG: depth {depth}, colour type {colour}")
    bpp = 3 if colour == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * bpp
    image = np.zeros((height, stride), dtype=np.uint8)
    previous = np.zeros(stride, dtype=np.int64)
    for y in range(height):
        start = y * (stride + 1)
        kind = raw[start]
        line = np.frombuffer(raw, dtype=np.uint8, count=stride, offset=start + 1).astype(np.int64)
        if kind == 1:  # Sub: a running sum along each channel
            line = np.cumsum(line.reshape(width, bpp), axis=0).reshape(stride) & 0xFF
        elif kind == 2:  # Up
            line = (line + previous) & 0xFF
        elif kind in (3, 4):  # Average, Paeth: each byte needs the one just decoded
            line = _sequential(kind, line, previous, bpp)
        image[y] = line
        previous = line
    pixels = image.reshape(height, width, bpp)[:, :, :3]
    return width, height, pixels


def _sequential(kind: int, line, previous, bpp: int):
    out = [0] * len(line)
    up_row = previous.tolist()
    raw = line.tolist()
    for i, value in enumerate(raw):
        left = out[i - bpp] if i >= bpp else 0
        up = up_row[i]
        if kind == 3:
            out[i] = (value + (left + up) // 2) & 0xFF
            continue
        corner = up_row[i - bpp] if i >= bpp else 0
        p = left + up - corner
        pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
        pred = left if pa <= pb and pa <= pc else (up if pb <= pc else corner)
        out[i] = (value + pred) & 0xFF
    return np.array(out, dtype=np.int64)


def count_near(pixels, colour: tuple[int, int, int], tolerance: int = 40) -> int:
    """Pixels within ``tolerance`` (per channel) of ``colour``."""
    near = np.abs(pixels.astype(np.int16) - np.array(colour, dtype=np.int16)) <= tolerance
    return int(near.all(axis=2).sum())
