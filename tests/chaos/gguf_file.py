"""GGUF mutations for the chaos run: a small codec that parses a GGUF file
into its header (metadata, tensor directory) and data, lets a mutation change
any part of it, and writes it back; plus raw byte-level mutations (bit flips,
truncations, lying counts).

Independent of ``engine.gguf.header`` on purpose: the reader under test must
not be the one that builds its inputs.
"""

from __future__ import annotations

import math
import random
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# GGUF value types
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
_FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<?",
        U64: "<Q", I64: "<q", F64: "<d"}


@dataclass
class Value:
    vtype: int
    value: Any  # scalar, bytes (STRING), or (item_type, [values]) for ARRAY


@dataclass
class Tensor:
    name: bytes
    dims: list[int]
    ttype: int
    offset: int


@dataclass
class Gguf:
    version: int
    kvs: list[tuple[bytes, Value]]
    tensors: list[Tensor]
    data: bytes
    alignment: int = 32
    n_tensors_override: int | None = None
    n_kv_override: int | None = None
    trailer: bytes = b""  # bytes inserted after the tensor directory, before padding
    notes: list[str] = field(default_factory=list)

    def key_index(self, suffix: str) -> int | None:
        for i, (k, _) in enumerate(self.kvs):
            if k.decode("utf-8", "replace").endswith(suffix):
                return i
        return None

    def keys(self) -> list[str]:
        return [k.decode("utf-8", "replace") for k, _ in self.kvs]


class _Reader:
    def __init__(self, buf: bytes) -> None:
        self.buf, self.pos = buf, 0

    def take(self, n: int) -> bytes:
        out = self.buf[self.pos:self.pos + n]
        if len(out) != n:
            raise ValueError("truncated")
        self.pos += n
        return out

    def unpack(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> bytes:
        return self.take(self.unpack("<Q"))

    def value(self, vtype: int) -> Any:
        if vtype in _FMT:
            return self.unpack(_FMT[vtype])
        if vtype == STRING:
            return self.string()
        item = self.unpack("<I")
        count = self.unpack("<Q")
        return (item, [self.value(item) for _ in range(count)])


def parse(buf: bytes) -> Gguf:
    r = _Reader(buf)
    assert r.take(4) == b"GGUF"
    version = r.unpack("<I")
    n_tensors, n_kv = r.unpack("<Q"), r.unpack("<Q")
    kvs = []
    for _ in range(n_kv):
        key = r.string()
        vtype = r.unpack("<I")
        kvs.append((key, Value(vtype, r.value(vtype))))
    tensors = []
    for _ in range(n_tensors):
        name = r.string()
        dims = [r.unpack("<Q") for _ in range(r.unpack("<I"))]
        tensors.append(Tensor(name, dims, r.unpack("<I"), r.unpack("<Q")))
    alignment = 32
    for k, v in kvs:
        if k == b"general.alignment" and isinstance(v.value, int):
            alignment = v.value
    start = (r.pos + alignment - 1) // alignment * alignment
    return Gguf(version, kvs, tensors, buf[start:], alignment)


@dataclass
class Raw:
    """A value's payload given as bytes (too deep to build as objects)."""

    payload: bytes


def _write_value(out: list[bytes], v: Value) -> None:
    if isinstance(v.value, Raw):
        out.append(v.value.payload)
    elif v.vtype in _FMT:
        out.append(struct.pack(_FMT[v.vtype], v.value))
    elif v.vtype == STRING:
        out.append(struct.pack("<Q", len(v.value)) + v.value)
    elif v.vtype == ARRAY:
        item, items = v.value
        out.append(struct.pack("<IQ", item, len(items)))
        for x in items:
            _write_value(out, x if isinstance(x, Value) else Value(item, x))
    else:  # an invalid type: write it as given, with no payload
        pass


def serialize(g: Gguf) -> bytes:
    out = [b"GGUF", struct.pack("<I", g.version),
           struct.pack("<Q", len(g.tensors) if g.n_tensors_override is None else g.n_tensors_override),
           struct.pack("<Q", len(g.kvs) if g.n_kv_override is None else g.n_kv_override)]
    for key, v in g.kvs:
        out.append(struct.pack("<Q", len(key)) + key + struct.pack("<I", v.vtype))
        _write_value(out, v)
    for t in g.tensors:
        out.append(struct.pack("<Q", len(t.name)) + t.name + struct.pack("<I", len(t.dims)))
        out.append(b"".join(struct.pack("<Q", d) for d in t.dims) + struct.pack("<IQ", t.ttype, t.offset))
    out.append(g.trailer)
    head = b"".join(out)
    align = g.alignment if isinstance(g.alignment, int) and 0 < g.alignment < 1 << 16 else 32
    pad = (-len(head)) % align
    return head + b"\0" * pad + g.data


# -- the mutations -----------------------------------------------------------------
# Each takes (rng, file bytes) and returns (description, new bytes).

Mutation = Callable[[random.Random, bytes], tuple[str, bytes]]

IMPORTANT_KEYS = (
    ".block_count", ".nextn_predict_layers", "general.alignment", "split.count", "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id", ".context_length", ".embedding_length", "general.architecture",
    "tokenizer.ggml.tokens", ".expert_count", ".attention.head_count", ".feed_forward_length",
    "tokenizer.ggml.model", "general.name", ".vocab_size", "tokenizer.ggml.token_type", "split.no",
    ".attention.head_count_kv", ".rope.freq_base", "general.file_type", "tokenizer.chat_template",
)


def set_key(g: Gguf, suffix: str, value: Value) -> bytes:
    """Set ``suffix`` (a key, or ``.name`` for ``<arch>.name``) to ``value``, adding the key if missing."""
    i = g.key_index(suffix)
    if i is None:
        arch = g.kvs[g.key_index("general.architecture")][1].value.decode()
        key = (arch + suffix if suffix.startswith(".") else suffix).encode()
        g.kvs.append((key, value))
    else:
        key = g.kvs[i][0]
        g.kvs[i] = (key, value)
    return key


def _pick_key(rng: random.Random, g: Gguf) -> int:
    wanted = [i for i, k in enumerate(g.keys()) if any(k.endswith(s) for s in IMPORTANT_KEYS)]
    if wanted and rng.random() < 0.8:
        return rng.choice(wanted)
    return rng.randrange(len(g.kvs))


def _nested(depth: int) -> Value:
    """An array of one array of one array … of one i32, ``depth`` levels deep."""
    return Value(ARRAY, Raw(struct.pack("<IQ", ARRAY, 1) * depth + struct.pack("<IQi", I32, 1, 1)))


def _replacement(rng: random.Random) -> tuple[str, Value]:
    choices: list[tuple[str, Value]] = [
        ("a string", Value(STRING, b"forty-two")),
        ("an empty string", Value(STRING, b"")),
        ("invalid UTF-8", Value(STRING, b"\xff\xfe\xc3(")),
        ("NaN", Value(F32, math.nan)),
        ("+inf", Value(F64, math.inf)),
        ("-1 (i32)", Value(I32, -1)),
        ("-2^63 (i64)", Value(I64, -(1 << 63))),
        ("2^64-1 (u64)", Value(U64, (1 << 64) - 1)),
        ("2^31 (u32)", Value(U32, 1 << 31)),
        ("0", Value(U32, 0)),
        ("true", Value(BOOL, True)),
        ("1.5", Value(F32, 1.5)),
        ("an int array", Value(ARRAY, (U32, [1, 2, 3]))),
        ("an empty array", Value(ARRAY, (U32, []))),
        ("a string array", Value(ARRAY, (STRING, [b"a", b"b"]))),
        ("a nested array", _nested(3)),
        ("a bad value type 77", Value(77, None)),
    ]
    return rng.choice(choices)


def m_type_swap(rng: random.Random, buf: bytes) -> tuple[str, bytes]:
    g = parse(buf)
    i = _pick_key(rng, g)
    what, v = _replacement(rng)
    key = g.kvs[i][0]
    g.kvs[i] = (key, v)
    return f"metadata {key.decode(errors='replace')} set to {what}", serialize(g)


def m_huge_value(rng: random.Random, buf: bytes) -> tuple[str, bytes]:
    g = parse(buf)
    suffix, value = rng.choice([
        (".nextn_predict_layers", 10**9), (".block_count", 10**9), (".nextn_predict_layers", 2**32 - 1),
        (".block_count", 2**32 - 1), (".expert_count", 10**9), (".embedding_length", 2**31),
        (".context_length", 2**63), ("general.alignment", 2**31), ("general.alignment", 3),
        ("split.count", 10**6), (".nextn_predict_layers", 64),
    ])
    i = g.key_index(suffix)
    if i is None:
        arch = g.kvs[g.key_index("general.architecture")][1].value.decode()
        key = (arch + suffix if suffix.startswith(".") else suffix).encode()
        g.kvs.append((key, Value(U64, value)))
    else:
        key = g.kvs[i][0]
        g.kvs[i] = (key, Value(U64 if value >= 2**32 else U32, value))
    return f"metadata {key.decode()} = {value}", serialize(g)


def m_small_value(rng: random.Random, buf: bytes) -> tuple[str, bytes]:
    g = parse(buf)
    suffix, value = rng.choice([
        (".block_count", 0), (".nextn_predict_layers", 0), (".block_count", 1), (".embedding_length", 0),
        (".context_length", 0), ("general.alignment", 0), ("split.count", 0), (".expert_count", 0),
        (".nextn_predict_layers", 5), (".block_count", 2), ("tokenizer.ggml.bos_token_id", 10**6),
    ])
    i = g.key_index(suffix)
    if i is None:
        arch = g.kvs[g.key_index("general.architecture")][1].value.decode()
        key = (arch + suffix if suffix.startswith(".") else suffix).encode()
        g.kvs.append((key, Value(U32, value)))
    else:
        key = g.kvs[i][0]
        g.kvs[i] = (key, Value(U32, value))
    return f"metadata {key.decode()} = {value}", serialize(g)


def m_lying_counts(rng: random.Random, buf: bytes) -> tuple[str, bytes]:
    g = parse(buf)
    which = rng.choice(["n_tensors 10^7", "n_tensors 2^64-1", "n_kv 10^6", "n_kv 2^40", "n_tensors +1", "n_kv +1",
                        "n_tensors 10^6"])
    if which.startswith("n_tensors"):
        g.n_tensors_override = {"n_tensors 10^7": 10**7, "n_tensors 2^64-1": 2**64 - 1,
                                "n_tensors +1": len(g.tensors) + 1, "n_tensors 10^6": 10**6}[which]
    else:
        g.n_kv_override = {"n_kv 10^6": 10**6, "n_kv 2^40": 2**40, "n_kv +1": len(g.kvs) + 1}[which]
    return f"header count {which}", serialize(g)


def m_huge_lengths(rng: random.Random, buf: bytes) -> tuple[str, bytes]:
    """A string or array length field far beyond the file."""
    g = parse(buf)
    body = serialize(g)
    i = rng.choice([k for k, key in enumerate(g.keys()) if key in ("general.name", "tokenizer.ggml.tokens",
                                                                  "general.architecture")] or [0])
    key = g.kvs[i][0]
    # find the key in the bytes and patch the length after its type field
    pos = body.index(struct.pack("<Q", len(key)) + key) + 8 + len(key)
    vtype = struct.unpack_from("<I", body, pos)[0]
    huge = rng.choice([2**63, 2**40, 10**9])
    patch_at = pos + 4 if vtype == STRING else pos + 8  # string length, or array count after the item type
    out = bytearray(body)
    out[patch_at:patch_at + 8] = struct.pack("<Q", huge)
    return f"{key.decode()} length/count field = {huge}", bytes(out)


def m_deep_nesting(rng: random.Random, buf: bytes) -> tuple[str, bytes]:
    g = parse(buf)
    depth = rng.choice([1000, 3000, 20000])
    g.kvs.append((b"chaos.nested", _nested(depth)))
    return f"a metadata array nested {depth} deep", serialize(g)


def m_tensor_dir(rng: random.Random, buf: bytes) -> tuple[str, bytes]:
    g = parse(buf)
    t = rng.choice(g.tensors)
    what = rng.choice(["dims 2^40", "dims 0", "n_dims 9", "n_dims 0", "type 999", "offset 2^62", "offset odd",
                       "duplicate name", "empty name", "name invalid UTF-8", "dims overflow"])
    if what == "dims 2^40":
        t.dims[0] = 2**40
    elif what == "dims 0":
        t.dims[0] = 0
    elif what == "n_dims 9":
        t.dims = t.dims + [1] * (9 - len(t.dims))
    elif what == "n_dims 0":
        t.dims = []
    elif what == "type 999":
        t.ttype = 999
    elif what == "offset 2^62":
        t.offset = 2**62
    elif what == "offset odd":
        t.offset += 3
    elif what == "duplicate name":
        t.name = rng.choice([u for u in g.tensors if u is not t]).name
    elif what == "empty name":
        t.name = b""
    elif what == "name invalid UTF-8":
        t.name = b"blk.\xff\xfe.weight"
    elif what == "dims overflow":
        t.dims = [2**32, 2**32, 2**32, 2**32][:max(2, len(t.dims))]
    return f"tensor {t.name.decode(errors='replace')}: {what}", serialize(g)


def m_many_tensors(rng: random.Random, buf: bytes) -> tuple[str, bytes]:
    """Tens of thousands of tiny tensor entries (quadratic duplicate checks)."""
    g = parse(buf)
    n = rng.choice([20000, 40000])
    dup = rng.random() < 0.5
    base = g.tensors[0]
    for k in range(n):
        g.tensors.append(Tensor(b"extra.%d" % (0 if dup else k), [1], 0, base.offset))  # F32, one element
    return f"{n} extra one-element tensors{' with one repeated name' if dup else ''}", serialize(g)


def m_keys(rng: random.Random, buf: bytes) -> tuple[str, bytes]:
    g = parse(buf)
    what = rng.choice(["drop", "duplicate", "rename arch", "empty key", "key invalid UTF-8", "unknown arch"])
    if what == "drop":
        i = _pick_key(rng, g)
        key = g.kvs.pop(i)[0]
        return f"metadata {key.decode(errors='replace')} removed", serialize(g)
    if what == "duplicate":
        i = _pick_key(rng, g)
        key = g.kvs[i][0]
        _, v = _replacement(rng)
        g.kvs.append((key, v))
        return f"metadata {key.decode(errors='replace')} repeated with another value", serialize(g)
    if what in ("rename arch", "unknown arch"):
        i = g.key_index("general.architecture")
        new = b"llama" if what == "rename arch" else b"chaos\xffarch"
        g.kvs[i] = (g.kvs[i][0], Value(STRING, new))
        return f"general.architecture = {new!r}", serialize(g)
    if what == "empty key":
        g.kvs.append((b"", Value(U32, 1)))
        return "an empty metadata key", serialize(g)
    g.kvs.append((b"general.\xff\xfe", Value(U32, 1)))
    return "a metadata key that is not UTF-8", serialize(g)


def m_version(rng: random.Random, buf: bytes) -> tuple[str, bytes]:
    v = rng.choice([0, 1, 4, 2**32 - 1])
    out = bytearray(buf)
    out[4:8] = struct.pack("<I", v)
    if rng.random() < 0.3:
        out[0:4] = b"GGUG"
        return "bad magic", bytes(out)
    return f"GGUF version {v}", bytes(out)


def m_bitflip(rng: random.Random, buf: bytes) -> tuple[str, bytes]:
    out = bytearray(buf)
    hlen = len(serialize(_headless(buf)))
    n = rng.choice([1, 1, 2, 4, 16])
    where = []
    for _ in range(n):
        pos = rng.randrange(hlen) if rng.random() < 0.85 else rng.randrange(len(out))
        out[pos] ^= 1 << rng.randrange(8)
        where.append(pos)
    return f"{n} bit flip(s) at byte(s) {sorted(where)}", bytes(out)


def m_truncate(rng: random.Random, buf: bytes) -> tuple[str, bytes]:
    hlen = len(serialize(_headless(buf)))
    cut = rng.randrange(hlen) if rng.random() < 0.6 else rng.randrange(hlen, len(buf))
    return f"truncated at byte {cut} of {len(buf)}", buf[:cut]


def m_chat_template(rng: random.Random, buf: bytes) -> tuple[str, bytes]:
    g = parse(buf)
    what, tpl = rng.choice([
        ("a template that loops ~forever",
         "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}x"),
        ("a memory-bomb template", "{{ 'x' * 10**10 }}"),
        ("a doubling-string template",
         "{% set ns = namespace(s='x') %}{% for a in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}"),
        ("a recursive macro", "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"),
        ("a template with a syntax error", "{% for m in messages %}{{ m.content "),
        ("a template that raises", "{{ raise_exception('no') }}"),
        ("a template escaping the sandbox", "{{ ''.__class__.__mro__[1].__subclasses__() }}"),
        ("a template printing bytes that are not text", "{{ '\\udcff' }}"),
        ("an empty template", ""),
    ])
    i = g.key_index("tokenizer.chat_template")
    if i is None:
        g.kvs.append((b"tokenizer.chat_template", Value(STRING, tpl.encode("utf-8", "surrogatepass"))))
    else:
        g.kvs[i] = (b"tokenizer.chat_template", Value(STRING, tpl.encode("utf-8", "surrogatepass")))
    return f"chat template: {what}", serialize(g)


def _headless(buf: bytes) -> Gguf:
    g = parse(buf)
    g.data = b""
    return g


MUTATIONS: list[tuple[str, Mutation]] = [
    ("type-swap", m_type_swap), ("huge-value", m_huge_value), ("small-value", m_small_value),
    ("lying-count", m_lying_counts), ("huge-length", m_huge_lengths), ("deep-nesting", m_deep_nesting),
    ("tensor-dir", m_tensor_dir), ("keys", m_keys), ("version", m_version), ("bitflip", m_bitflip),
    ("truncate", m_truncate), ("type-swap", m_type_swap), ("bitflip", m_bitflip), ("chat-template", m_chat_template),
    ("many-tensors", m_many_tensors),
]
