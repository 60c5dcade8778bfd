"""A fast reader for a GGUF file's header: metadata and tensor directory.

``gguf.GGUFReader`` builds a numpy view per string, which takes ~10 s on a
262k-token vocabulary; the app reads headers on every load and library scan.
This reader walks the same format (https://github.com/ggml-org/ggml/blob/master/docs/gguf.md)
once, keeps small values, and summarises big arrays (the token list becomes
a count and a sha256) without building per-item objects.
"""

from __future__ import annotations

import hashlib
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.errors import ModelFileError

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
BIG_ARRAY = 4096  # arrays longer than this are summarised, not kept

_SCALARS = {
    0: ("<B", 1), 1: ("<b", 1), 2: ("<H", 2), 3: ("<h", 2), 4: ("<I", 4), 5: ("<i", 4),
    6: ("<f", 4), 7: ("<?", 1), 10: ("<Q", 8), 11: ("<q", 8), 12: ("<d", 8),
}
STRING, ARRAY = 8, 9


@dataclass(frozen=True)
class StringArraySummary:
    """A long string array: its length and the sha256 of each item followed by NUL."""

    count: int
    sha256: str


@dataclass(frozen=True)
class ArraySummary:
    count: int
    item_type: int


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # ggml order (ne0 first)
    ggml_type: int
    offset: int  # absolute byte offset of the data in the file
    n_bytes: int

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True)
class Header:
    version: int
    metadata: dict[str, Any]
    tensors: list[TensorInfo]
    data_start: int
    file_size: int


class _Cursor:
    def __init__(self, buf: Any, name: str) -> None:
        self.buf = buf
        self.pos = 0
        self.name = name

    def take(self, n: int) -> Any:
        end = self.pos + n
        if end > len(self.buf):
            raise ModelFileError(
                f"{self.name} ends inside its header (byte {len(self.buf)}); it is truncated. Download it again."
            )
        chunk = self.buf[self.pos:end]
        self.pos = end
        return chunk

    def unpack(self, fmt: str, size: int) -> Any:
        return struct.unpack(fmt, self.take(size))[0]

    def string(self) -> bytes:
        n = self.unpack("<Q", 8)
        if n > len(self.buf):
            raise ModelFileError(f"{self.name} has a corrupt header (string of {n} bytes).")
        return self.take(n)

    def value(self, vtype: int) -> Any:
        if vtype in _SCALARS:
            fmt, size = _SCALARS[vtype]
            return self.unpack(fmt, size)
        if vtype == STRING:
            return self.string().decode("utf-8", errors="replace")
        if vtype == ARRAY:
            item_type = self.unpack("<I", 4)
            count = self.unpack("<Q", 8)
            return self.array(item_type, count)
        raise ModelFileError(f"{self.name} has a corrupt header (value type {vtype}).")

    def array(self, item_type: int, count: int) -> Any:
        if item_type == STRING:
            if count <= BIG_ARRAY:
                return [self.string().decode("utf-8", errors="replace") for _ in range(count)]
            digest = hashlib.sha256()
            for _ in range(count):
                digest.update(self.string())
                digest.update(b"\0")
            return StringArraySummary(count, digest.hexdigest())
        if item_type in _SCALARS:
            fmt, size = _SCALARS[item_type]
            raw = self.take(size * count)
            if count <= BIG_ARRAY:
                return list(struct.unpack(f"<{count}{fmt[1]}", raw))
            return ArraySummary(count, item_type)
        if item_type == ARRAY:  # arrays of arrays: walk them, keep nothing
            for _ in range(count):
                self.value(ARRAY)
            return ArraySummary(count, item_type)
        raise ModelFileError(f"{self.name} has a corrupt header (array item type {item_type}).")


def _tensor_bytes(ggml_type: int, shape: tuple[int, ...]) -> int:
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    except (ValueError, KeyError):
        raise ModelFileError(f"unknown tensor type {ggml_type}") from None
    n = 1
    for d in shape:
        n *= d
    return n // block * size


def read_header(path: Path) -> Header:
    """Parse the header of ``path``.

    Raises:
        ModelFileError: not a GGUF file, a corrupt or truncated header, or
            tensor data that would lie past the end of the file.
    """
    try:
        with path.open("rb") as f:
            size = path.stat().st_size
            if size < 24:
                raise ModelFileError(f"{path.name} is not a GGUF file (it holds only {size} bytes).")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                return _parse(buf, path.name, size)  # slicing an mmap copies: no exports outlive it
    except FileNotFoundError:
        raise ModelFileError(f"Model file not found: {path}") from None
    except IsADirectoryError:
        raise ModelFileError(f"{path} is a folder, not a GGUF file.") from None
    except PermissionError:
        raise ModelFileError(f"No permission to read {path}.") from None


def _parse(buf: Any, name: str, size: int) -> Header:
    cur = _Cursor(buf, name)
    magic = bytes(cur.take(4))
    if magic != MAGIC:
        raise ModelFileError(f"{name} is not a GGUF file (it starts with {magic!r}, not b'GGUF').")
    version = cur.unpack("<I", 4)
    if version not in (2, 3):
        raise ModelFileError(f"{name} is GGUF version {version}; only versions 2 and 3 are supported.")
    n_tensors = cur.unpack("<Q", 8)
    n_kv = cur.unpack("<Q", 8)
    if n_tensors > 10**7 or n_kv > 10**6:
        raise ModelFileError(f"{name} has a corrupt header ({n_tensors} tensors, {n_kv} keys).")
    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        key = cur.string().decode("utf-8", errors="replace")
        metadata[key] = cur.value(cur.unpack("<I", 4))
    raw: list[tuple[str, tuple[int, ...], int, int]] = []
    for _ in range(n_tensors):
        tname = cur.string().decode("utf-8", errors="replace")
        n_dims = cur.unpack("<I", 4)
        if n_dims > 8:
            raise ModelFileError(f"{name} has a corrupt tensor entry ({tname}: {n_dims} dimensions).")
        shape = tuple(cur.unpack("<Q", 8) for _ in range(n_dims))
        ggml_type = cur.unpack("<I", 4)
        offset = cur.unpack("<Q", 8)
        raw.append((tname, shape, ggml_type, offset))
    alignment = int(metadata.get("general.alignment", DEFAULT_ALIGNMENT)) or DEFAULT_ALIGNMENT
    data_start = (cur.pos + alignment - 1) // alignment * alignment
    tensors = []
    for tname, shape, ggml_type, offset in raw:
        n_bytes = _tensor_bytes(ggml_type, shape)
        start = data_start + offset
        if start + n_bytes > size:
            raise ModelFileError(
                f"{name} is truncated: tensor {tname} ends at byte {start + n_bytes} but the file has "
                f"{size} bytes. Download it again."
            )
        tensors.append(TensorInfo(tname, shape, ggml_type, start, n_bytes))
    return Header(version=version, metadata=metadata, tensors=tensors, data_start=data_start, file_size=size)
