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
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, overload

from engine.errors import ModelFileError

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
BIG_ARRAY = 4096  # arrays longer than this are summarised, not kept
# Counts read from a header are bounded before anything is allocated or looped
# over: by what the file's bytes can hold, and by hard caps far above any real
# model (the largest have a few thousand tensors, tens of thousands with unfused
# experts, and a few hundred keys). Reading a tensor entry costs ~5 µs and ~250
# bytes, so the tensor cap keeps the worst header to about a second.
MAX_TENSORS = 1 << 18
MAX_KEYS = 1_000_000
MAX_ARRAY = 1 << 24  # items in one metadata array (vocabularies and merge lists hold under a million)
MAX_NESTING = 8  # arrays of arrays deeper than this are refused (llama.cpp accepts none at all)
_MIN_TENSOR_INFO = 24  # name length (8) + n_dims (4) + type (4) + offset (8)
_MIN_KV = 13  # key length (8) + value type (4) + a one-byte value

_SCALARS = {
    0: ("<B", 1), 1: ("<b", 1), 2: ("<H", 2), 3: ("<h", 2), 4: ("<I", 4), 5: ("<i", 4),
    6: ("<f", 4), 7: ("<?", 1), 10: ("<Q", 8), 11: ("<q", 8), 12: ("<d", 8),
}
STRING, ARRAY = 8, 9
TYPE_NAMES = {0: "uint8", 1: "int8", 2: "uint16", 3: "int16", 4: "uint32", 5: "int32", 6: "float32", 7: "bool",
              8: "string", 9: "array", 10: "uint64", 11: "int64", 12: "float64"}
_MIN_ITEM = {STRING: 8, ARRAY: 12, **{t: size for t, (_, size) in _SCALARS.items()}}
# What Header.get accepts for each expectation that is not one exact type name.
_ACCEPTS = {
    "integer": frozenset({"uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64"}),
    "string array": frozenset({"array of string"}),
}
_EXPECTED_WORDS = {"integer": "an integer", "string array": "an array of strings"}


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
    types: dict[str, str] = field(default_factory=dict)  # key -> GGUF type name ("uint32", "array of string")
    name: str = ""  # the file's name, for messages
    alignment: int = DEFAULT_ALIGNMENT

    def get(self, key: str, expected: str, default: Any = None) -> Any:
        """The value of ``key``, or ``default`` when the key is absent.

        Every metadata value the engine uses is read here, because a value of
        another type than the format intends (a string block count, a NaN
        alignment, an array token id) otherwise surfaces far away as a
        ValueError or TypeError traceback. ``expected`` is a GGUF type name
        ("uint32", "string") or "integer" (any integer type) or "string array".

        Raises:
            ModelFileError: naming the key, the type found and the type expected.
        """
        if key not in self.metadata:
            return default
        found = self.types.get(key, "unknown")
        if found not in _ACCEPTS.get(expected, {expected}):
            raise ModelFileError(
                f"{self.name} is malformed: its metadata key {key} holds {_describe(found, self.metadata[key])}, "
                f"expected {_EXPECTED_WORDS.get(expected, expected)}. Download it again or use another export."
            )
        return self.metadata[key]

    @overload
    def integer(self, key: str, default: int, *, low: int = 0, high: int) -> int: ...

    @overload
    def integer(self, key: str, default: None = None, *, low: int = 0, high: int) -> int | None: ...

    def integer(self, key: str, default: int | None = None, *, low: int = 0, high: int) -> int | None:
        """An integer value of ``key`` (see :meth:`get`) within ``low``..``high``: a count read from a
        header is bounded before anything is allocated or looped over from it."""
        value = self.get(key, "integer", default)
        if value is not None and not low <= value <= high:
            raise ModelFileError(
                f"{self.name} is malformed: its metadata key {key} is {value}, outside {low}…{high}. "
                "Download it again or use another export."
            )
        return value


def _describe(type_name: str, value: Any) -> str:
    """What a message shows of a value: "a string ('five')", "a float32 (nan)", "an array of uint32"."""
    article = "an" if type_name[0] in "aeiou" else "a"
    if type_name.startswith("array"):
        return f"{article} {type_name}"
    shown = repr(value)
    return f"{article} {type_name} ({shown[:40] + '…' if len(shown) > 40 else shown})"


class _Cursor:
    def __init__(self, buf: Any, name: str) -> None:
        self.buf = buf
        self.pos = 0
        self.name = name
        self.key = ""  # the metadata key being read, for messages

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

    def value(self, vtype: int, depth: int = 0) -> tuple[Any, str]:
        """(value, GGUF type name) of a value of type ``vtype`` at the cursor."""
        if vtype in _SCALARS:
            fmt, size = _SCALARS[vtype]
            return self.unpack(fmt, size), TYPE_NAMES[vtype]
        if vtype == STRING:
            return self.string().decode("utf-8", errors="replace"), "string"
        if vtype == ARRAY:
            item_type = self.unpack("<I", 4)
            count = self.unpack("<Q", 8)
            item_name = TYPE_NAMES.get(item_type, f"type {item_type}")
            return self.array(item_type, count, depth + 1), f"array of {item_name}"
        raise ModelFileError(f"{self.name} has a corrupt header (value type {vtype} for key {self.key}).")

    def array(self, item_type: int, count: int, depth: int) -> Any:
        if item_type not in _MIN_ITEM:
            raise ModelFileError(f"{self.name} has a corrupt header (array item type {item_type} for key {self.key}).")
        if count > MAX_ARRAY or count * _MIN_ITEM[item_type] > len(self.buf) - self.pos:
            raise ModelFileError(f"{self.name} has a corrupt header: metadata key {self.key} claims an array of "
                                 f"{count} items, more than the file's remaining bytes can hold (or the limit "
                                 f"of {MAX_ARRAY}).")
        if item_type == STRING:
            return self._strings(count)
        if item_type in _SCALARS:
            fmt, size = _SCALARS[item_type]
            raw = self.take(size * count)
            if count <= BIG_ARRAY:
                return list(struct.unpack(f"<{count}{fmt[1]}", raw))
            return ArraySummary(count, item_type)
        # arrays of arrays: walk them, keep nothing; the depth is bounded so that the walk is
        if depth >= MAX_NESTING:
            raise ModelFileError(f"{self.name} has a corrupt header: metadata key {self.key} nests arrays more "
                                 f"than {MAX_NESTING} deep.")
        for _ in range(count):
            self.value(ARRAY, depth)
        return ArraySummary(count, item_type)

    def _strings(self, count: int) -> list[str] | StringArraySummary:
        if count <= BIG_ARRAY:
            return [self.string().decode("utf-8", errors="replace") for _ in range(count)]
        digest = hashlib.sha256()
        for _ in range(count):
            digest.update(self.string())
            digest.update(b"\0")
        return StringArraySummary(count, digest.hexdigest())


@cache
def _block_sizes() -> dict[int, tuple[int, int]]:
    """ggml type id -> (elements per block, bytes per block); built once, looked up per tensor."""
    from gguf.constants import GGML_QUANT_SIZES

    return {int(t): sizes for t, sizes in GGML_QUANT_SIZES.items()}


def _tensor_bytes(ggml_type: int, shape: tuple[int, ...], where: str) -> int:
    try:
        block, size = _block_sizes()[ggml_type]
    except KeyError:
        raise ModelFileError(f"{where} has unknown tensor type {ggml_type}; the file is corrupt or too new.") from None
    n = 1
    for d in shape:
        n *= d
    return n // block * size


def read_header(path: Path) -> Header:
    """Parse the header of ``path``.

    Raises:
        ModelFileError: not a GGUF file, a corrupt or truncated header, a count
            the file cannot hold, a wrong ``general.alignment``, or tensor data
            that would lie past the end of the file.
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
    _check_counts(name, n_tensors, n_kv, size - cur.pos)
    metadata: dict[str, Any] = {}
    types: dict[str, str] = {}
    for _ in range(n_kv):
        cur.key = cur.string().decode("utf-8", errors="replace")
        metadata[cur.key], types[cur.key] = cur.value(cur.unpack("<I", 4))
    if n_tensors * _MIN_TENSOR_INFO > size - cur.pos:
        raise ModelFileError(f"{name} has a corrupt header: it claims {n_tensors} tensors, more than the "
                             f"{size - cur.pos} bytes after its metadata can describe.")
    raw = [_tensor_entry(cur, name) for _ in range(n_tensors)]
    partial = Header(version, metadata, [], 0, size, types, name)
    alignment = _alignment(partial)
    data_start = (cur.pos + alignment - 1) // alignment * alignment
    tensors = [_place(name, size, data_start, *entry) for entry in raw]
    return Header(version, metadata, tensors, data_start, size, types, name, alignment)


def _check_counts(name: str, n_tensors: int, n_kv: int, remaining: int) -> None:
    """Refuse counts the file cannot hold before looping over them: a count field
    is eight bytes anyone can set to 10^18, and every entry costs time and memory."""
    if n_tensors > MAX_TENSORS or n_tensors * _MIN_TENSOR_INFO > remaining:
        raise ModelFileError(f"{name} has a corrupt header: it claims {n_tensors} tensors, more than its "
                             f"{remaining} header bytes can describe (or the limit of {MAX_TENSORS}).")
    if n_kv > MAX_KEYS or n_kv * _MIN_KV > remaining:
        raise ModelFileError(f"{name} has a corrupt header: it claims {n_kv} metadata keys, more than its "
                             f"{remaining} header bytes can hold (or the limit of {MAX_KEYS}).")


def _tensor_entry(cur: _Cursor, name: str) -> tuple[str, tuple[int, ...], int, int]:
    tname = cur.string().decode("utf-8", errors="replace")
    n_dims = cur.unpack("<I", 4)
    if n_dims > 8:
        raise ModelFileError(f"{name} has a corrupt tensor entry ({tname}: {n_dims} dimensions).")
    *shape, ggml_type, offset = struct.unpack(f"<{n_dims}QIQ", cur.take(8 * n_dims + 12))
    return tname, tuple(shape), ggml_type, offset


def _alignment(header: Header) -> int:
    """general.alignment as llama.cpp requires it: a uint32 power of two (gguf.cpp refuses anything else)."""
    alignment = header.get("general.alignment", "uint32", DEFAULT_ALIGNMENT)
    if alignment <= 0 or alignment & (alignment - 1):
        raise ModelFileError(f"{header.name} is malformed: its general.alignment is {alignment}, not a power of two.")
    return alignment


def _place(name: str, size: int, data_start: int, tname: str, shape: tuple[int, ...], ggml_type: int,
           offset: int) -> TensorInfo:
    """A tensor's absolute position, refused if its data would lie past the end of the file."""
    n_bytes = _tensor_bytes(ggml_type, shape, f"{name}: tensor {tname}")
    start = data_start + offset
    if start + n_bytes > size:
        raise ModelFileError(
            f"{name} is truncated: tensor {tname} ends at byte {start + n_bytes} but the file has "
            f"{size} bytes. Download it again."
        )
    return TensorInfo(tname, shape, ggml_type, start, n_bytes)
