"""The sidecar doctor: does this MTP sidecar fit this target, and if not, why,
in plain words — and can Repair fix it?

Everything is read from the two files' headers; nothing is loaded.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from engine.gguf_header import read_header
from engine.gguf_info import GGUFFacts, read_facts
from engine.sidecar import MTP_ARCHITECTURES, unexpected_tensors

_BLK = re.compile(r"^blk\.(\d+)\.")
NEXTN_REQUIRED = ("eh_proj", "enorm", "hnorm")


@dataclass(frozen=True)
class Finding:
    severity: str  # ok | warning | error
    text: str
    fixable: bool = False


@dataclass
class Diagnosis:
    target: GGUFFacts
    sidecar: GGUFFacts
    findings: list[Finding] = field(default_factory=list)
    renumber_from: int | None = None  # relative first block index to move to n_trunk
    drop: list[str] = field(default_factory=list)  # tensors Repair removes

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def repairable(self) -> bool:
        return bool(self.errors) and all(f.fixable for f in self.errors)

    def verdict(self) -> str:
        if self.ok:
            return f"{self.sidecar.path.name} fits {self.target.path.name}."
        if self.repairable:
            return (f"{self.sidecar.path.name} does not load as it is, but Repair can fix it "
                    "(it writes a corrected copy).")
        return f"{self.sidecar.path.name} cannot be used with {self.target.path.name}; get the matching sidecar."

    def report(self) -> str:
        mark = {"ok": "ok  ", "warning": "warn", "error": "FAIL"}
        lines = [self.verdict(), ""]
        lines += [f"  [{mark[f.severity]}] {f.text}" + ("  (Repair fixes this)" if f.fixable and f.severity == "error"
                                                        else "") for f in self.findings]
        return "\n".join(lines)


def diagnose(target_path: str | Path, sidecar_path: str | Path) -> Diagnosis:
    target, sidecar = read_facts(target_path), read_facts(sidecar_path)
    d = Diagnosis(target, sidecar)
    add = d.findings.append

    def compare(what: str, side: object, tgt: object) -> bool:
        if side == tgt:
            add(Finding("ok", f"{what}: {tgt} on both."))
            return True
        add(Finding("error", f"{what}: the sidecar has {side}, the target {tgt}. It was made for another model."))
        return False

    compare("architecture", sidecar.architecture, target.architecture)
    if sidecar.architecture not in MTP_ARCHITECTURES:
        add(Finding("error", f"This engine has no MTP graph for {sidecar.architecture}."))
    compare("hidden size (n_embd_out)", sidecar.n_embd_out, target.n_embd_out)
    compare("vocabulary size", sidecar.vocab_size, target.vocab_size)
    if sidecar.token_list_sha256 == target.token_list_sha256:
        add(Finding("ok", "token lists are identical."))
    else:
        add(Finding("error", "the token lists differ (same size, other tokens): drafts would be other words."))
    if sidecar.nextn_layers <= 0:
        add(Finding("error", "the sidecar declares no MTP/NextN layers (nextn_predict_layers is 0)."))
        return d
    target_trunk = target.block_count - target.nextn_layers
    compare("trunk layers", sidecar.trunk_layers, target_trunk)
    _check_blocks(d, sidecar)
    _check_shapes(d, sidecar)
    return d


def _check_blocks(d: Diagnosis, sidecar: GGUFFacts) -> None:
    add = d.findings.append
    n_trunk, n_heads = sidecar.trunk_layers, sidecar.nextn_layers
    indices = sorted({int(m.group(1)) for n in sidecar.tensor_names if (m := _BLK.match(n))})
    expected = list(range(n_trunk, n_trunk + n_heads))
    if indices == expected:
        add(Finding("ok", f"MTP blocks use absolute indices ({', '.join(map(str, expected))}), "
                          "as this loader expects."))
    elif indices == list(range(n_heads)):
        d.renumber_from = 0
        add(Finding("error", f"MTP blocks are numbered from 0 (relative); this loader expects blk.{n_trunk}"
                             f"…blk.{n_trunk + n_heads - 1} (absolute).", fixable=True))
    else:
        add(Finding("error", f"block indices {indices} match neither convention (expected {expected})."))
    dupes = sorted({n for n in sidecar.tensor_names if sidecar.tensor_names.count(n) > 1})
    if dupes:
        add(Finding("error", f"tensors stored twice under one name: {', '.join(dupes[:3])}.", fixable=True))
    extra = unexpected_tensors(sidecar.tensor_names)
    if extra:
        d.drop = extra
        add(Finding("error", f"{len(extra)} tensor(s) the loader does not consume (legacy duplicate names), e.g. "
                             f"{', '.join(extra[:3])}; llama.cpp rejects the file ('wrong number of tensors').",
                    fixable=True))
    base = n_trunk if d.renumber_from is None else 0
    present = set(sidecar.tensor_names)
    missing = [f"blk.{base + h}.nextn.{part}.weight" for h in range(n_heads) for part in NEXTN_REQUIRED
               if f"blk.{base + h}.nextn.{part}.weight" not in present]
    if missing:
        add(Finding("error", f"required tensors missing: {', '.join(missing)}. The export is incomplete."))
    elif not d.errors:
        add(Finding("ok", f"{sidecar.tensor_count} tensors, every required NextN tensor present."))


def _check_shapes(d: Diagnosis, sidecar: GGUFFacts) -> None:
    e = sidecar.n_embd
    header = read_header(sidecar.path)
    for t in header.tensors:
        part = t.name.split(".nextn.")[-1] if ".nextn." in t.name else None
        want = {"eh_proj.weight": (2 * e, e), "enorm.weight": (e,), "hnorm.weight": (e,)}.get(part or "")
        if want and tuple(t.shape) != want:
            d.findings.append(Finding("error", f"{t.name} has shape {list(t.shape)}, expected {list(want)}."))
