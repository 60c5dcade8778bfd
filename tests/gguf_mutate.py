"""Take a well-formed GGUF apart into its pieces and put it back together with
one piece changed: a metadata value of another type, a count field that lies,
a nested array. Tests of the header reader use it to make the hostile files a
user may meet without keeping any of them in the repository.

Only well-formed input files are parsed (the synthetic models); the output may
be as broken as the test asks.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = range(13)
_SIZES = {UINT8: 1, INT8: 1, UINT16: 2, INT16: 2, UINT32: 4, INT32: 4, FLOAT32: 4, BOOL: 1,
          UINT64: 8, INT64: 8, FLOAT64: 8}
_FORMATS = {UINT8: "<B", INT8: "<b", UINT16: "<H", INT16: "<h", UINT32: "<I", INT32: "<i", FLOAT32: "<f",
            BOOL: "<?", UINT64: "<Q", INT64: "<q", FLOAT64: "<d"}


def string(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def value(vtype: int, v: object) -> bytes:
    """A typed metadata value as it follows a key: type id, then the payload."""
    if vtype == STRING:
        return struct.pack("<I", STRING) + string(v)  # type: ignore[arg-type]
    return struct.pack("<I", vtype) + struct.pack(_FORMATS[vtype], v)


def array(item_type: int, items: Sequence[object]) -> bytes:
    body = b"".join(string(i) if item_type == STRING else struct.pack(_FORMATS[item_type], i)  # type: ignore[arg-type]
                    for i in items)
    return struct.pack("<IIQ", ARRAY, item_type, len(items)) + body


def nested_array(depth: int) -> bytes:
    """``depth`` arrays, each holding only the next one; the innermost holds one uint8."""
    inner = array(UINT8, [1])
    for _ in range(depth - 1):
        inner = struct.pack("<IIQ", ARRAY, ARRAY, 1) + inner[4:]
    return inner


@dataclass
class Gguf:
    """A GGUF file in pieces: ``kv`` maps each key to its encoded value (type id included)."""

    version: int
    kv: dict[str, bytes]
    tensor_infos: list[bytes]
    data: bytes
    alignment: int = 32
    n_tensors: int | None = None  # the count field, when it should lie
    n_kv: int | None = None
    extra: list[tuple[str, bytes]] = field(default_factory=list)  # appended as they are (duplicate keys)

    def with_kv(self, key: str, encoded: bytes) -> Gguf:
        return replace(self, kv={**self.kv, key: encoded})

    def to_bytes(self) -> bytes:
        pairs = [*self.kv.items(), *self.extra]
        n_tensors = len(self.tensor_infos) if self.n_tensors is None else self.n_tensors
        n_kv = len(pairs) if self.n_kv is None else self.n_kv
        out = bytearray(b"GGUF" + struct.pack("<IQQ", self.version, n_tensors, n_kv))
        for key, encoded in pairs:
            out += string(key) + encoded
        for info in self.tensor_infos:
            out += info
        out += b"\0" * (-len(out) % self.alignment)
        return bytes(out + self.data)

    def spans(self) -> list[tuple[str, int, int]]:
        """(label, start, end) of each piece of :meth:`to_bytes`' header: the counts, each
        key/value pair, each tensor info, so that a fuzzer can aim at structure, not just text."""
        pos = 24
        out = [("counts", 0, 24)]
        for key, encoded in [*self.kv.items(), *self.extra]:
            end = pos + 8 + len(key.encode()) + len(encoded)
            out.append((f"kv {key}", pos, end))
            pos = end
        for i, info in enumerate(self.tensor_infos):
            out.append((f"tensor {i}", pos, pos + len(info)))
            pos += len(info)
        return out

    def write(self, path: Path) -> Path:
        path.write_bytes(self.to_bytes())
        return path


def tensor_info(name: str, shape: tuple[int, ...], ggml_type: int, offset: int) -> bytes:
    return string(name) + struct.pack("<I", len(shape)) + struct.pack(f"<{len(shape)}Q", *shape) + \
        struct.pack("<IQ", ggml_type, offset)


class _Reader:
    def __init__(self, buf: bytes) -> None:
        self.buf, self.pos = buf, 0

    def take(self, n: int) -> bytes:
        self.pos += n
        return self.buf[self.pos - n:self.pos]

    def u32(self) -> int:
        return struct.unpack("<I", self.take(4))[0]

    def u64(self) -> int:
        return struct.unpack("<Q", self.take(8))[0]

    def skip_value(self, vtype: int) -> None:
        if vtype == STRING:
            self.take(self.u64())
        elif vtype == ARRAY:
            item, count = self.u32(), self.u64()
            for _ in range(count):
                self.skip_value(item)
        else:
            self.take(_SIZES[vtype])


def parse(path: Path) -> Gguf:
    """Split a well-formed GGUF into version, encoded key/values, tensor infos and data."""
    buf = path.read_bytes()
    r = _Reader(buf)
    assert r.take(4) == b"GGUF"
    version, n_tensors, n_kv = r.u32(), r.u64(), r.u64()
    kv: dict[str, bytes] = {}
    alignment = 32
    for _ in range(n_kv):
        key = r.take(r.u64()).decode()
        start = r.pos
        vtype = r.u32()
        r.skip_value(vtype)
        kv[key] = buf[start:r.pos]
        if key == "general.alignment":
            alignment = struct.unpack("<I", kv[key][4:8])[0]
    infos = []
    for _ in range(n_tensors):
        start = r.pos
        r.take(r.u64())
        r.take(8 * r.u32())
        r.take(12)
        infos.append(buf[start:r.pos])
    data_start = r.pos + (-r.pos % alignment)
    return Gguf(version, kv, infos, buf[data_start:], alignment)
