"""Synthetic test images: a few flat colour fields, written as PNG with no imaging library.

Tests and benchmarks of the vision path need images that differ in known ways
and decode the same everywhere; a grid of solid colours written by the
smallest valid PNG encoder (8-bit RGB, one IDAT, no filtering) is both.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence

RGB = tuple[int, int, int]

RED: RGB = (230, 30, 30)
GREEN: RGB = (30, 200, 60)
BLUE: RGB = (30, 60, 220)
YELLOW: RGB = (240, 220, 40)
WHITE: RGB = (255, 255, 255)
BLACK: RGB = (0, 0, 0)


def fields(width: int, height: int, colours: Sequence[Sequence[RGB]]) -> bytes:
    """Raw RGB bytes (row-major) of an image divided into a grid of solid fields.

    ``colours[row][col]``: the grid, e.g. ``[[RED, GREEN], [BLUE, YELLOW]]`` for four quadrants.
    """
    rows, cols = len(colours), len(colours[0])
    out = bytearray()
    for y in range(height):
        line = colours[min(y * rows // height, rows - 1)]
        for x in range(width):
            out += bytes(line[min(x * cols // width, cols - 1)])
    return bytes(out)


def png(width: int, height: int, rgb: bytes) -> bytes:
    """A PNG file of ``rgb`` (``width * height * 3`` bytes, row-major)."""
    if len(rgb) != width * height * 3:
        raise ValueError(f"{len(rgb)} bytes of RGB for a {width}x{height} image (expected {width * height * 3})")

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    stride = width * 3
    raw = b"".join(b"\x00" + rgb[y * stride:(y + 1) * stride] for y in range(height))  # filter 0 per row
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit, colour type 2 (RGB)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


def field_png(colours: Sequence[Sequence[RGB]], width: int = 32, height: int = 32) -> bytes:
    """A PNG of solid colour fields (see :func:`fields`)."""
    return png(width, height, fields(width, height, colours))
