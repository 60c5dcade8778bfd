"""Does an MTP source fit a target? Checked from GGUF metadata, before any
native load, because llama.cpp only asserts (aborting the process) on a
mismatch, or does not check at all (vocabulary).

One set of rules, :func:`assess`, serves both the load-time check
(:func:`check_sidecar`, which refuses on the first error) and the model
manager's doctor (which shows every finding and what Repair would do), so
that what the doctor calls fitting always loads, and the reverse.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from engine.errors import SidecarMismatch, SpeculativeUnavailable
from engine.gguf import loader_tensors
from engine.gguf.facts import GGUFFacts

# Architectures whose llama.cpp graph runs an MTP head (DECODER_MTP).
MTP_ARCHITECTURES = frozenset(
    {"qwen35", "qwen35moe", "qwen3next", "step35", "mimo2", "hy_v3", "glm4moe", "deepseek2",
     "deepseek32", "glm-dsa", "cohere2moe", "bailingmoe3", "nemotron_h_moe", "deepseek4",
     "qwen4exp"}  # qwen4exp: our engine patch (packaging/patches/0003-qwen4exp-mtp-head.patch)
)

NEXTN_REQUIRED = ("eh_proj", "enorm", "hnorm")  # every NextN block needs these three
# qwen4exp's head feeds [e | h_s] to eh_proj without norms (its hyper-connection mixers normalise)
NEXTN_REQUIRED_BY_ARCH = {"qwen4exp": ("eh_proj",)}
HC_HEAD_PARTS = ("norm", "down", "up")  # qwen4exp's head mixer: blk.N.nextn.hc_head_* or output_hc_*
_BLK = re.compile(r"^blk\.(\d+)\.")
_SHOWN = 3  # findings of one kind listed one by one before the rest are counted


def check_target_has_mtp(target: GGUFFacts) -> None:
    """Raise SpeculativeUnavailable unless the target file itself carries MTP blocks."""
    if target.nextn_layers <= 0:
        raise SpeculativeUnavailable(
            f"{target.path.name} ({target.architecture}) has no MTP/NextN layers; "
            "decoding without speculation. Choose a model with an MTP head or add an MTP sidecar."
        )
    if target.architecture not in MTP_ARCHITECTURES:
        raise SpeculativeUnavailable(
            f"{target.architecture} declares {target.nextn_layers} NextN layer(s) but this engine "
            "has no MTP graph for that architecture; decoding without speculation."
        )
    if target.layout == "trunk-only":
        raise SpeculativeUnavailable(
            f"{target.path.name} is a trunk-only export (its MTP blocks were left out). "
            "Load it with its MTP sidecar (mtp-*.gguf)."
        )
    mtp_blocks = range(target.block_count - target.nextn_layers, target.block_count)
    if problem := _graph_requirement(target.architecture, set(target.tensor_names), mtp_blocks):
        raise SpeculativeUnavailable(f"{target.path.name}: {problem} Decoding without speculation.")


def _graph_requirement(arch: str, present: set[str], mtp_blocks: Iterable[int]) -> str | None:
    """What an MTP graph asserts at the first draft (killing the process) but no loader checks."""
    if arch == "mimo2":
        split = [il for il in mtp_blocks if f"blk.{il}.attn_qkv.weight" not in present]
        if split:
            return (f"its MTP block blk.{split[0]} stores attention as separate q/k/v tensors, but llama.cpp's "
                    "mimo2 MTP graph needs them fused (attn_qkv) and aborts at the first draft. "
                    "Use an export with fused MTP attention.")
    if arch == "qwen4exp":
        for il in mtp_blocks:
            own = all(f"blk.{il}.nextn.hc_head_{p}.weight" in present for p in HC_HEAD_PARTS)
            if not own and not all(f"output_hc_{p}.weight" in present for p in HC_HEAD_PARTS):
                return (f"its MTP block blk.{il} has no head mixer (neither blk.{il}.nextn.hc_head_norm/down/up "
                        "nor output_hc_norm/down/up), which the qwen4exp MTP head collapses its streams with. "
                        "Use a complete MTP export.")
    return None


@dataclass(frozen=True)
class Finding:
    severity: str  # ok | warning | error
    text: str
    fixable: bool = False  # Repair can fix it
    unavailable: bool = False  # not a mismatch: this engine cannot run MTP for the architecture


@dataclass(frozen=True)
class RepairPlan:
    """What Repair changes in a copy of the sidecar; derived from the target's metadata."""

    shift: int = 0  # added to every block index
    block_count: int | None = None  # new {arch}.block_count (metadata renumbered to the MTP blocks alone)
    drop: tuple[str, ...] = ()  # tensors the loader does not consume
    dedupe: tuple[str, ...] = ()  # names stored more than once: one copy is kept


@dataclass
class Assessment:
    target: GGUFFacts
    sidecar: GGUFFacts
    findings: list[Finding] = field(default_factory=list)
    plan: RepairPlan = field(default_factory=RepairPlan)

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    def add(self, severity: str, text: str, *, fixable: bool = False, unavailable: bool = False) -> None:
        self.findings.append(Finding(severity, text, fixable, unavailable))


def check_sidecar(target: GGUFFacts, sidecar: GGUFFacts) -> None:
    """Raise SidecarMismatch (SpeculativeUnavailable for an architecture without an
    MTP graph) with the first problem :func:`assess` finds, if ``sidecar`` cannot serve ``target``."""
    errors = assess(target, sidecar).errors
    if not errors:
        return
    first = errors[0]
    more = f" ({len(errors) - 1} more problem(s): run the doctor in the model manager.)" if len(errors) > 1 else ""
    if first.unavailable:
        raise SpeculativeUnavailable(first.text)
    raise SidecarMismatch(first.text + more)


def unexpected_tensors(names: tuple[str, ...] | list[str], arch: str) -> list[str]:
    """Tensor names a file of ``arch`` holds that llama.cpp's loader would not create
    (the table is generated from the vendored loaders: engine/gguf/loader_tensors.py)."""
    return loader_tensors.unconsumed(arch, names)


def assess(target: GGUFFacts, sidecar: GGUFFacts) -> Assessment:
    """Every finding about ``sidecar`` serving ``target``, in the order a user should read them."""
    a = Assessment(target, sidecar)
    name = sidecar.path.name
    get_matching = f"Download the sidecar made for {target.name or target.path.name}."

    def same(what: str, side: object, tgt: object) -> bool:
        if side == tgt:
            a.add("ok", f"{'vocabulary size' if what == 'a vocabulary of' else what}: {tgt} on both.")
            return True
        a.add("error", f"The MTP sidecar {name} was made for a model with {what} {side}; this target has "
                       f"{what} {tgt}. {get_matching}")
        return False

    if sidecar.nextn_layers <= 0:
        a.add("error", f"{name} has no MTP/NextN layers (nextn_predict_layers is 0); it is not an MTP sidecar. "
                       "Choose the mtp-*.gguf file of this model.")
        return a
    if not same("architecture", sidecar.architecture, target.architecture):
        return a
    if sidecar.architecture not in MTP_ARCHITECTURES:
        a.add("error", f"This engine has no MTP graph for {sidecar.architecture}.", unavailable=True)
        return a
    if same("hidden size (n_embd_out)", sidecar.n_embd_out, target.n_embd_out) and sidecar.n_embd != target.n_embd:
        same("embedding size (n_embd)", sidecar.n_embd, target.n_embd)
    same("a vocabulary of", sidecar.vocab_size, target.vocab_size)
    if sidecar.token_list_sha256 == target.token_list_sha256:
        a.add("ok", "token lists are identical.")
    else:
        same("token list hash", sidecar.token_list_sha256[:12], target.token_list_sha256[:12])
    trunk = target.block_count - target.nextn_layers
    if _check_trunk(a, trunk, get_matching):
        _check_blocks(a, trunk)
    _check_tensors(a)
    return a


def _check_trunk(a: Assessment, trunk: int, get_matching: str) -> bool:
    """Trunk layer counts; a sidecar whose metadata counts only its MTP blocks is fixable
    from the target's metadata. False when the sidecar belongs to another model."""
    side = a.sidecar
    if side.trunk_layers == trunk:
        a.add("ok", f"trunk layers: {trunk} on both.")
        return True
    if side.trunk_layers == 0 and trunk > 0:
        block_count = trunk + side.nextn_layers
        a.plan = _with(a.plan, block_count=block_count)
        a.add("error", f"{side.path.name} was renumbered: its metadata counts only the MTP blocks (block_count "
                       f"{side.block_count} = nextn_predict_layers), so the loader would look for them with no "
                       f"trunk before them. Repair takes the count from the target: block_count {block_count}, "
                       f"MTP blocks at blk.{trunk}.", fixable=True)
        return True
    a.add("error", f"The MTP sidecar {side.path.name} was made for a model with trunk layers {side.trunk_layers}; "
                   f"this target has trunk layers {trunk}. {get_matching}")
    return False


def _check_blocks(a: Assessment, trunk: int) -> None:
    """Where the MTP blocks sit: llama.cpp wants them at absolute indices blk.<trunk>…

    Compared as runs (first index, count) rather than as lists built from the
    header's counts: the work stays proportional to the tensors the file holds.
    """
    side = a.sidecar
    n = side.nextn_layers
    blocks = sorted({int(m.group(1)) for t in side.tensor_names if (m := _BLK.match(t))})
    span = _span(trunk, n)
    if _is_run(blocks, trunk, n):
        a.add("ok", f"MTP blocks use absolute indices ({span}), as this loader expects.")
    elif _is_run(blocks, 0, trunk + n) and side.trunk_layers == trunk:
        a.add("warning", f"{side.path.name} is a complete model (trunk and MTP blocks), not an MTP-only sidecar: "
                         f"it works, but its trunk is loaded a second time ({side.file_size / 2**20:.0f} MiB). "
                         "Load it on its own instead: its MTP head is built in.")
    elif blocks and _is_run(blocks, blocks[0], n):
        k = blocks[0]
        how = "from 0 (relative instead of absolute)" if k == 0 else f"from blk.{k}"
        a.plan = _with(a.plan, shift=trunk - k)
        a.add("error", f"MTP blocks are numbered {how}; this engine's loader expects {span} "
                       f"(absolute, after the target's {trunk} trunk layers). Run Repair in the model manager.",
              fixable=True)
    else:
        a.add("error", f"block indices {_few(blocks)} match no convention (expected {span}); "
                       "this export cannot be repaired. Use another export.")


def _is_run(blocks: list[int], first: int, n: int) -> bool:
    """Whether sorted, distinct ``blocks`` are exactly first, first+1, …, first+n-1."""
    return len(blocks) == n and (n == 0 or (blocks[0] == first and blocks[-1] == first + n - 1))


def _span(first: int, n: int) -> str:
    return f"blk.{first}" + (f"…blk.{first + n - 1}" if n > 1 else "")


def _few(items: Sequence[object], limit: int = 6) -> str:
    """At most ``limit`` items and how many more: a finding is one line, whatever the file claims."""
    shown = ", ".join(map(str, items[:limit]))
    return shown + (f", … ({len(items)} in all)" if len(items) > limit else "")


def _check_tensors(a: Assessment) -> None:
    """Names the loader would refuse, the NextN tensors and globals it requires, their shapes."""
    side = a.sidecar
    name, arch, names = side.path.name, side.architecture, side.tensor_names
    errors_before = len(a.errors)
    dupes = tuple(sorted(t for t, count in Counter(names).items() if count > 1))
    if dupes:
        a.plan = _with(a.plan, dedupe=dupes)
        a.add("error", f"{name} holds {len(dupes)} tensor(s) stored twice under one name, e.g. "
                       f"{', '.join(dupes[:3])}; llama.cpp refuses the file. Repair keeps one copy "
                       "(if the copies are identical).", fixable=True)
    extra = tuple(dict.fromkeys(unexpected_tensors(names, arch)))
    if extra:
        a.plan = _with(a.plan, drop=extra)
        a.add("error", f"{name} holds {len(extra)} tensor(s) this engine's loader does not consume, e.g. "
                       f"{', '.join(extra[:3])} — usually the same weights stored again under a legacy exporter's "
                       "names (legacy duplicate names). llama.cpp rejects the file ('wrong number of tensors'). "
                       "Run Repair.", fixable=True)
    present = set(names) - set(extra)
    heads = sorted({int(m.group(1)) for t in present if (m := _BLK.match(t)) and ".nextn." in t})
    heads = heads[-side.nextn_layers:] if heads else []
    incomplete = "the export is incomplete. Download it again or use another export."
    required = NEXTN_REQUIRED_BY_ARCH.get(arch, NEXTN_REQUIRED)
    missing = [f"blk.{il}.nextn.{part}.weight" for il in heads for part in required
               if f"blk.{il}.nextn.{part}.weight" not in present]
    if missing:
        a.add("error", f"{name} is missing tensor {_few(missing)}; {incomplete}")
    if not heads:
        a.add("error", f"{name} holds no NextN tensors (blk.N.nextn.*): it is not an MTP export. "
                       "Choose the mtp-*.gguf file of this model.")
    _check_globals(a, present, heads)
    if heads and (problem := _graph_requirement(arch, present, heads)):
        a.add("error", f"{name}: {problem}")
    if arch == "qwen4exp":
        _check_head_mixer(a, present, heads)
    _check_shapes(a)
    if len(a.errors) == errors_before:
        a.add("ok", f"{side.tensor_count} tensors, every tensor the loader needs present, nothing it would refuse.")


def _check_globals(a: Assessment, present: set[str], heads: list[int]) -> None:
    """Non-block tensors: llama.cpp's loaders require the token embedding and final norm in
    every file, a sidecar too, and the MTP graph needs an LM head (its own or the model's)."""
    side = a.sidecar
    arch, name = side.architecture, side.path.name
    export = ("The export is incomplete: use a full MTP export (llama.cpp's --mtp export keeps token_embd, "
              "output_norm and output).")
    missing = [t for t in loader_tensors.required_globals(arch) if t not in present]
    for t in missing:
        why = {"token_embd.weight": "the token embedding, which the MTP head embeds each draft token with",
               "output.weight": "the model's LM head"}.get(t, "a tensor")
        a.add("error", f"{name} has no {t} ({why}); llama.cpp's {arch} loader requires it in a sidecar too. {export}")
    if "output.weight" in missing:
        return
    if "output.weight" in present or (loader_tensors.output_tied(arch) and "token_embd.weight" in present):
        return
    headless = [il for il in heads if f"blk.{il}.nextn.shared_head_head.weight" not in present]
    if headless:
        a.add("error", f"{name} has neither blk.{headless[0]}.nextn.shared_head_head.weight nor output.weight: the "
                       "MTP head has no LM head to turn its output into token scores (llama.cpp aborts)"
                       + (f"; nor do {len(headless) - 1} more head(s). " if len(headless) > 1 else ". ") + export)


def _check_head_mixer(a: Assessment, present: set[str], heads: list[int]) -> None:
    """qwen4exp sidecars in the wild store the head's mixer twice, as blk.N.nextn.hc_head_* and
    again as output_hc_* (seed 002). This engine's loader consumes both and uses the first;
    other llama.cpp builds reject the copies ("wrong number of tensors; expected 35, got 30")."""
    own = [il for il in heads if all(f"blk.{il}.nextn.hc_head_{p}.weight" in present for p in HC_HEAD_PARTS)]
    again = tuple(f"output_hc_{p}.weight" for p in HC_HEAD_PARTS if f"output_hc_{p}.weight" in present)
    blocks = {int(m.group(1)) for t in present if (m := _BLK.match(t))}
    if own and again and blocks <= set(heads):  # an MTP-only file: in a full model output_hc_* is the trunk's
        a.plan = _with(a.plan, drop=tuple(dict.fromkeys(a.plan.drop + again)))
        a.add("warning", f"{a.sidecar.path.name} stores the MTP head's mixer twice: as blk.{own[0]}.nextn.hc_head_* "
                         f"and again as {', '.join(again)} (duplicate mixer). This engine uses blk.{own[0]}.nextn."
                         "hc_head_* and loads the file; other llama.cpp builds reject the copies ('wrong number of "
                         "tensors'). Repair writes a copy without them.", fixable=True)


def _check_shapes(a: Assessment) -> None:
    """NextN tensors with the wrong shape: one finding per tensor for the first few, then a count."""
    e = a.sidecar.n_embd
    want = {"eh_proj.weight": (2 * e, e), "enorm.weight": (e,), "hnorm.weight": (e,)}
    wrong = []
    for tname, shape in zip(a.sidecar.tensor_names, a.sidecar.tensor_shapes, strict=False):
        part = tname.split(".nextn.")[-1] if ".nextn." in tname else ""
        if part in want and tuple(shape) != want[part]:
            wrong.append((tname, shape, want[part]))
    for tname, shape, expected in wrong[:_SHOWN]:
        a.add("error", f"{tname} has shape {list(shape)}, expected {list(expected)} for n_embd {e}; "
                       "the export is broken. Use another export.")
    if len(wrong) > _SHOWN:
        a.add("error", f"{len(wrong) - _SHOWN} more NextN tensor(s) have the wrong shape; the export is broken.")


def _with(plan: RepairPlan, **changes: object) -> RepairPlan:
    return replace(plan, **changes)  # type: ignore[arg-type]
