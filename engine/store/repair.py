"""Repair a broken MTP sidecar by writing a corrected copy.

Fixes what the doctor marks fixable: relative block indices are renumbered
to absolute ones, and tensors the loader does not consume (legacy duplicate
names) are dropped. Tensor data is streamed from a memory map of the source
into the new file, never read whole into RAM; the copy is written under a
temporary name and renamed into place only when complete. The result is then
proven by loading it beside the target in a child process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from engine.errors import EngineError
from engine.store.doctor import diagnose


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
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    d = diagnose(target, sidecar)
    if d.ok:
        raise RepairError(f"{Path(sidecar).name} already fits {Path(target).name}; nothing to repair.")
    if not d.repairable:
        problems = "; ".join(f.text for f in d.errors if not f.fixable)
        raise RepairError(f"Repair cannot fix this sidecar: {problems}")
    src = Path(sidecar)
    out = Path(out) if out else src.with_name(src.stem + ".repaired.gguf")
    delta = d.sidecar.trunk_layers if d.renumber_from is not None else 0
    drop = set(d.drop)

    reader = GGUFReader(src, "r")
    arch = d.sidecar.architecture
    tmp = out.with_name(out.name + ".partial")
    writer = GGUFWriter(tmp, arch)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        vtype = field.types[0]
        value = field.contents()
        if vtype == GGUFValueType.ARRAY:
            writer.add_key_value(key, value, vtype, sub_type=field.types[-1])
        else:
            writer.add_key_value(key, value, vtype)
    seen: set[str] = set()
    for tensor in reader.tensors:
        if tensor.name in drop:
            continue
        name = _renumber(tensor.name, delta)
        if name in seen:  # a tensor stored twice: keep the first copy
            continue
        seen.add(name)
        # tensor.data is a view of the memory map: bytes move file to file.
        writer.add_tensor(name, tensor.data, raw_shape=list(reversed([int(x) for x in tensor.shape])),
                          raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(tmp, out)
    after = diagnose(target, out)
    if not after.ok:
        raise RepairError(f"the repaired copy still has problems: {'; '.join(f.text for f in after.errors)}")
    return out


_PROOF = """
import sys
from engine.generation.generator import GenerateRequest, generate
from engine.generation.session import LoadOptions, Session
from engine.speculative.drafter import SpeculativeParams
s = Session(LoadOptions(path=sys.argv[1], sidecar=sys.argv[2], n_ctx=256))
r = generate(s, GenerateRequest(prompt=" the", max_tokens=8, speculative=SpeculativeParams("mtp", 2)))
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
