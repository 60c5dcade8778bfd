"""Repair a broken MTP sidecar by writing a corrected copy.

Fixes what the doctor marks fixable (``engine.gguf.sidecar.RepairPlan``): blocks
moved to the absolute indices the target's metadata gives (from 0, or from
any wrong offset), metadata that counts only the MTP blocks rewritten from
the target's, tensors the loader does not consume dropped, and a tensor
stored twice under one name kept once (only if the copies are identical).

The file is read with our own header reader, not ``gguf.GGUFReader``, which
refuses duplicate names outright. Metadata is copied byte for byte except
the keys Repair changes; tensor data streams from a memory map of the source
into the new file, never whole in RAM. The copy is written under a temporary
name and renamed into place only when complete, then proven by loading it
beside the target in a child process.
"""

from __future__ import annotations

import mmap
import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any, BinaryIO

from engine.errors import EngineError
from engine.gguf.header import _SCALARS, ARRAY, DEFAULT_ALIGNMENT, Header, TensorInfo, _Cursor, read_header
from engine.gguf.sidecar import RepairPlan
from engine.store.doctor import diagnose

_CHUNK = 64 * 2**20


class RepairError(EngineError):
    kind = "repair"


def _renumber(name: str, delta: int) -> str:
    if not name.startswith("blk.") or not delta:
        return name
    parts = name.split(".")
    parts[1] = str(int(parts[1]) + delta)
    return ".".join(parts)


def repair(target: str | Path, sidecar: str | Path, out: str | Path | None = None) -> Path:
    """Write a repaired copy of ``sidecar`` and return its path.

    Raises:
        RepairError: the sidecar has problems Repair cannot fix, or nothing to fix.
    """
    d = diagnose(target, sidecar)
    if d.ok and not d.repairable:
        raise RepairError(f"{Path(sidecar).name} already fits {Path(target).name}; nothing to repair.")
    if not d.repairable:
        problems = "; ".join(f.text for f in d.errors if not f.fixable)
        raise RepairError(f"Repair cannot fix this sidecar: {problems}")
    src = Path(sidecar)
    out = Path(out) if out else src.with_name(src.stem + ".repaired.gguf")
    header = read_header(src)
    overrides = _metadata_overrides(d.plan, header, read_header(Path(target)), d.sidecar.architecture,
                                    d.target.block_count - d.target.nextn_layers)
    tmp = out.with_name(out.name + ".partial")
    try:
        with src.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            tensors = _select_tensors(d.plan, header, buf, src.name)
            with tmp.open("wb") as dst:
                _write(dst, buf, header, src.name, overrides, tensors)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    after = diagnose(target, out)
    if not after.ok:
        raise RepairError(f"the repaired copy still has problems: {'; '.join(f.text for f in after.errors)}")
    return out


def _select_tensors(plan: RepairPlan, header: Header, buf: Any, name: str) -> list[tuple[str, TensorInfo]]:
    """The tensors of the copy under their new names: dropped ones left out, duplicates once."""
    drop = set(plan.drop)
    kept: dict[str, TensorInfo] = {}
    origin: dict[str, str] = {}
    for t in header.tensors:
        if t.name in drop:
            continue
        new = _renumber(t.name, plan.shift)
        if new not in kept:
            kept[new], origin[new] = t, t.name
            continue
        first = kept[new]
        if origin[new] != t.name:
            raise RepairError(f"renumbering {t.name} to {new} collides with {origin[new]} in {name}; "
                              "this export cannot be repaired. Use another export.")
        if (first.shape, first.ggml_type) != (t.shape, t.ggml_type) or not _same_bytes(buf, first, t):
            raise RepairError(f"{name} stores {t.name} twice with different contents; Repair cannot tell which "
                              "copy is right. Download the sidecar again or use another export.")
    return list(kept.items())


def _same_bytes(buf: Any, a: TensorInfo, b: TensorInfo) -> bool:
    if a.n_bytes != b.n_bytes:
        return False
    for pos in range(0, a.n_bytes, _CHUNK):
        n = min(_CHUNK, a.n_bytes - pos)
        if buf[a.offset + pos:a.offset + pos + n] != buf[b.offset + pos:b.offset + pos + n]:
            return False
    return True


def _metadata_overrides(plan: RepairPlan, side: Header, target: Header, arch: str, trunk: int) -> dict[str, Any]:
    """New values for the keys a renumbered sidecar got wrong, taken from the target's metadata.

    block_count, and every per-layer array (one entry per block in both files): the
    target's entries for its trunk layers followed by the sidecar's own for its MTP blocks.
    An array that is not per-layer in the target is left as it is; the proof load that
    follows Repair would catch a wrong guess.
    """
    if plan.block_count is None:
        return {}
    old = int(side.metadata.get(f"{arch}.block_count", 0))
    n = plan.block_count - trunk
    target_blocks = int(target.metadata.get(f"{arch}.block_count", 0))
    out: dict[str, Any] = {f"{arch}.block_count": plan.block_count}
    for key, value in side.metadata.items():
        theirs = target.metadata.get(key)
        per_layer = isinstance(value, list) and len(value) == old > 0
        if key.startswith(f"{arch}.") and per_layer and isinstance(theirs, list) and len(theirs) == target_blocks:
            out[key] = list(theirs[:trunk]) + list(value[-n:])
    return out


def _kv_spans(buf: Any, name: str) -> tuple[int, list[tuple[str, int, int, int]]]:
    """(version, [(key, start, end, value type)]) of the source's metadata, as byte spans."""
    cur = _Cursor(buf, name)
    cur.take(4)
    version = cur.unpack("<I", 4)
    cur.unpack("<Q", 8)
    n_kv = cur.unpack("<Q", 8)
    spans = []
    for _ in range(n_kv):
        start = cur.pos
        key = cur.string().decode("utf-8", errors="replace")
        vtype = cur.unpack("<I", 4)
        cur.value(vtype)
        spans.append((key, start, cur.pos, vtype))
    return version, spans


def _string(s: str) -> bytes:
    raw = s.encode("utf-8")
    return struct.pack("<Q", len(raw)) + raw


def _encode_kv(key: str, value: Any, like: bytes) -> bytes:
    """``key`` = ``value`` in the value type the source used (``like`` is the source's entry)."""
    vtype = struct.unpack_from("<I", like, 8 + struct.unpack_from("<Q", like)[0])[0]
    if vtype == ARRAY:
        item = struct.unpack_from("<I", like, 8 + len(key.encode()) + 4)[0]
        fmt = _SCALARS[item][0]
        return (_string(key) + struct.pack("<II", ARRAY, item) + struct.pack("<Q", len(value))
                + b"".join(struct.pack(fmt, v) for v in value))
    return _string(key) + struct.pack("<I", vtype) + struct.pack(_SCALARS[vtype][0], value)


def _pad(n: int, alignment: int) -> int:
    return (n + alignment - 1) // alignment * alignment


def _write(dst: BinaryIO, buf: Any, header: Header, name: str, overrides: dict[str, Any],
           tensors: list[tuple[str, TensorInfo]]) -> None:
    version, spans = _kv_spans(buf, name)
    alignment = int(header.metadata.get("general.alignment", DEFAULT_ALIGNMENT)) or DEFAULT_ALIGNMENT
    out = bytearray(b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(spans)))
    for key, start, end, _vtype in spans:
        raw = bytes(buf[start:end])
        out += _encode_kv(key, overrides[key], raw) if key in overrides else raw
    offset = 0
    for new, t in tensors:
        out += _string(new) + struct.pack("<I", len(t.shape)) + b"".join(struct.pack("<Q", d) for d in t.shape)
        out += struct.pack("<IQ", t.ggml_type, offset)
        offset += _pad(t.n_bytes, alignment)
    out += bytes(_pad(len(out), alignment) - len(out))
    dst.write(out)
    for _new, t in tensors:  # bytes move from the memory map to the file, a chunk at a time
        for pos in range(0, t.n_bytes, _CHUNK):
            dst.write(buf[t.offset + pos:t.offset + min(t.n_bytes, pos + _CHUNK)])
        dst.write(bytes(_pad(t.n_bytes, alignment) - t.n_bytes))


_PROOF = """
import sys
from engine.generation.generator import GenerateRequest, generate
from engine.generation.session import LoadOptions, Session
from engine.speculative.settings import SpeculativeSettings
s = Session(LoadOptions(path=sys.argv[1], sidecar=sys.argv[2], n_ctx=256))
r = generate(s, GenerateRequest(prompt=" the", max_tokens=8, speculative=SpeculativeSettings("mtp", 2)))
print("PROOF", s.mtp_status, r.stats.rounds, r.stats.drafted, r.stats.accepted)
s.close()
"""


def prove(target: str | Path, sidecar: str | Path, timeout: float = 300) -> str:
    """Load target + sidecar in the engine (in a child process) and draft a few tokens.

    Returns the summary line; raises RepairError with llama.cpp's words if it fails.
    """
    proc = subprocess.run([sys.executable, "-c", _PROOF, str(target), str(sidecar)], capture_output=True,
                          text=True, timeout=timeout)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("PROOF")), None)
    if proc.returncode != 0 or line is None:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RepairError(f"the engine could not use the pair (exit {proc.returncode}): {tail}")
    _, status, rounds, drafted, accepted = line.split()
    return f"loaded with MTP ({status}); {rounds} rounds, {accepted}/{drafted} drafts accepted"
