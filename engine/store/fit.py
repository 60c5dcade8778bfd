"""Will this model fit? An estimate of what llama.cpp will allocate — weights,
KV cache, recurrent state, the MTP context and compute buffers — and of the
checkpoints each sequence keeps in host memory, read from the GGUF header,
against the memory this machine has.

The compute-buffer model was fitted to llama.cpp's own reported buffer sizes
(``sched_reserve: CPU compute buffer size``) on CPU builds with flash
attention "auto": one f16 attention mask of n_ctx × n_ubatch per attention
kind (two when sliding-window layers exist) plus per-token activations of
about 4·n_embd + 3·(active FFN width) floats.
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.errors import ModelFileError
from engine.gguf.facts import read_facts, shard_paths, windowed
from engine.gguf.header import read_header

MIB = 2**20
N_UBATCH = 512
# checkpoints each sequence keeps (engine/generation/checkpoints.py): the last prompt's end and the one before
CHECKPOINTS_KEPT = 2
MTP_RS_SNAPSHOTS = 8  # engine.speculative.drafter.MAX_DRAFT: n_rs_seq for hybrid targets with MTP
# Architectures whose recurrent state keeps per-token snapshots (llm_arch_supports_rs_rollback).
RS_ROLLBACK_ARCHS = frozenset({"qwen35", "qwen35moe", "qwen4exp", "bailingmoe3", "nemotron_h_moe", "deepseek4"})


@dataclass(frozen=True)
class MemoryEstimate:
    weights: int
    kv_cache: int
    recurrent: int
    mtp_context: int
    compute: int
    available: int | None
    # host copies each sequence keeps at its recent prompts' ends (engine/generation/checkpoints.py): a hybrid's
    # recurrent state, or a window-only cache's window cells; never offloaded
    checkpoints: int = 0

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.recurrent + self.mtp_context + self.compute + self.checkpoints

    @property
    def verdict(self) -> str:
        if self.available is None:
            return "unknown"
        if self.total > self.available:
            return "won't fit"
        return "tight" if self.total > 0.8 * self.available else "fits"

    def lines(self) -> list[str]:
        def mib(x: int) -> str:
            return f"{x / MIB:9.1f} MiB"

        out = [f"weights       {mib(self.weights)}", f"KV cache      {mib(self.kv_cache)}"]
        if self.recurrent:
            out.append(f"recurrent     {mib(self.recurrent)}")
        if self.mtp_context:
            out.append(f"MTP context   {mib(self.mtp_context)}")
        if self.checkpoints:
            out.append(f"checkpoints   {mib(self.checkpoints)}")
        out += [f"compute       {mib(self.compute)}", f"total         {mib(self.total)}"]
        if self.available is not None:
            out.append(f"available     {mib(self.available)}  → {self.verdict}")
        return out


def _per_layer(meta: dict[str, Any], key: str, n: int, default: int) -> list[int]:
    value = meta.get(key, default)
    return [int(v) for v in value][:n] if isinstance(value, list) else [int(value)] * n


def _recurrent_layers(arch: str, meta: dict[str, Any], n_trunk: int) -> list[bool]:
    if f"{arch}.ssm.state_size" not in meta:
        return [False] * n_trunk
    explicit = meta.get(f"{arch}.attention.recurrent_layers")
    if isinstance(explicit, list):
        return [bool(x) for x in explicit[:n_trunk]]
    interval = int(meta.get(f"{arch}.full_attention_interval", 4))
    return [(i + 1) % interval != 0 for i in range(n_trunk)]


# llama.cpp's pattern of sliding-window layers where the GGUF does not list them (load_swa_pattern in its
# models/*.cpp): every n-th layer attends fully, the last of each n (the first where dense_first); 0: every
# layer is windowed (set_swa_pattern(0)). An architecture not here windows no layer unless its GGUF lists them:
# llama.cpp marks none by default, and Phi-3 writes a window it ignores.
_SWA_PATTERNS = {"gemma2": (2, False), "gemma3": (6, False), "gemma3n": (5, False), "gemma-embedding": (6, False),
                 "cohere2": (4, False), "cohere2moe": (4, True), "gpt-oss": (2, False), "llama4": (4, False),
                 "exaone4": (4, False), "exaone-moe": (4, False), "olmo2": (4, False), "afmoe": (4, False),
                 "smallthinker": (4, True), "laguna": (4, True), "mellum": (4, False), "modern-bert": (3, True),
                 "muse-glimmer": (4, False), "plamo3": (8, False), "deepseek4": (0, False), "dflash": (0, False)}


# llama.cpp's hybrids (llm_arch_is_hybrid): loaded with a full-size cache for any windowed layers, as the
# session loads them (engine/generation/session.py), whether or not their GGUF has ssm.* keys (deepseek4)
HYBRID_ARCHS = frozenset({"jamba", "falcon-h1", "plamo2", "granitehybrid", "lfm2", "lfm2moe", "nemotron_h",
                          "nemotron_h_moe", "qwen3next", "kimi-linear", "bailingmoe3", "kimi-k3", "glm5-next",
                          "qwen35", "qwen35moe", "qwen4exp", "deepseek4", "minimax-01"})


def _window_layers(arch: str, meta: dict[str, Any], n_trunk: int) -> list[bool]:
    """Which trunk layers attend through a sliding window (none where the model has no window)."""
    if not windowed(int(meta.get(f"{arch}.attention.sliding_window", 0) or 0), arch,
                    int(meta.get(f"{arch}.block_count", 0))):
        return [False] * n_trunk
    pattern = meta.get(f"{arch}.attention.sliding_window_pattern")
    if isinstance(pattern, list):
        return [bool(x) for x in pattern[:n_trunk]] + [False] * max(0, n_trunk - len(pattern))
    if arch not in _SWA_PATTERNS:
        return [False] * n_trunk
    n, dense_first = _SWA_PATTERNS[arch]
    n = int(pattern) if pattern is not None else n
    if n <= 0:
        return [True] * n_trunk
    return [(i % n != 0) if dense_first else (i % n < n - 1) for i in range(n_trunk)]


def _pad256(n: int) -> int:
    return -(-n // 256) * 256


def window_cells(n_swa: int, n_ctx: int, n_seq: int = 1, unified: bool = True) -> int:
    """Cells a windowed layer's cache has without ``swa_full``, padded to 256 (llama_kv_cache_iswa): in one
    pool (``unified``) every sequence's window and one ubatch, at most the context; in a pool per sequence
    each pool its own window and ubatch, at most that sequence's context (n_ctx / n_seq, padded)."""
    if unified:
        return min(n_ctx, _pad256(n_swa * n_seq + N_UBATCH))
    return n_seq * min(_pad256(n_ctx // max(1, n_seq)), _pad256(n_swa + N_UBATCH))


def available_memory() -> int | None:
    """Memory a new model can take without swapping, in bytes (psutil: Linux, macOS and Windows alike)."""
    import psutil

    try:
        return int(psutil.virtual_memory().available)
    except (OSError, RuntimeError):
        return None


def estimate(path: str | Path, *, n_ctx: int = 4096, sidecar: str | Path | None = None, mtp: bool = True,
             available: int | None = None, swa_full: bool = False) -> MemoryEstimate:
    """Raises ModelFileError when a size the estimate reads has the wrong type."""
    return estimates(path, [n_ctx], sidecar=sidecar, mtp=mtp, available=available, swa_full=swa_full)[0]


def estimates(path: str | Path, n_ctxs: list[int], *, sidecar: str | Path | None = None, mtp: bool = True,
              available: int | None = None, swa_full: bool = False,
              n_seqs: list[int] | None = None, kv_unified: bool = True) -> list[MemoryEstimate]:
    """:func:`estimate` for each context size in ``n_ctxs`` (over ``n_seqs`` sequences each, default one),
    the headers read once (a header with a real vocabulary takes ~0.2 s to parse). ``swa_full``: a
    sliding-window model's windowed layers keep every cell (LoadOptions.swa_full). ``kv_unified``: the
    sequences share one pool of cells (LoadOptions.kv_unified), else each has its own, whose windowed
    layers then hold a ubatch more each."""
    try:
        return _estimate(path, n_ctxs=n_ctxs, sidecar=sidecar, mtp=mtp, available=available, swa_full=swa_full,
                         n_seqs=n_seqs or [1] * len(n_ctxs), kv_unified=kv_unified)
    except (TypeError, ValueError, OverflowError) as exc:  # per-layer sizes read as plain values below
        raise ModelFileError(f"{Path(path).name}: a size in its metadata is not a usable number ({exc}). "
                             "Download it again or use another export.") from exc


def _estimate(path: str | Path, *, n_ctxs: list[int], sidecar: str | Path | None, mtp: bool,
              available: int | None, swa_full: bool, n_seqs: list[int], kv_unified: bool) -> list[MemoryEstimate]:
    facts = read_facts(path)
    arch, meta = facts.architecture, read_header(Path(path)).metadata
    n_trunk = facts.trunk_layers
    head_count = _per_layer(meta, f"{arch}.attention.head_count", facts.block_count, 1)
    kv_heads = _per_layer(meta, f"{arch}.attention.head_count_kv", facts.block_count, head_count[0])
    dk = int(meta.get(f"{arch}.attention.key_length", facts.n_embd // max(1, head_count[0])))
    dv = int(meta.get(f"{arch}.attention.value_length", dk))
    recurrent = _recurrent_layers(arch, meta, n_trunk)
    hybrid = any(recurrent) or arch in HYBRID_ARCHS
    window_layers = _window_layers(arch, meta, n_trunk)
    windowed = [False] * n_trunk if swa_full or hybrid else window_layers
    n_swa = int(meta.get(f"{arch}.attention.sliding_window", 0) or 0)
    use_mtp = mtp and (facts.has_mtp or sidecar is not None)

    # weights: every tensor llama.cpp loads (MTP blocks only when drafting)
    mtp_re = re.compile(rf"^blk\.({'|'.join(str(i) for i in range(n_trunk, facts.block_count))})\.") \
        if facts.nextn_layers else None
    weights = 0
    for shard in shard_paths(Path(path), facts.split_count):
        for t in read_header(shard).tensors:
            if not use_mtp and mtp_re is not None and mtp_re.match(t.name):
                continue
            weights += t.n_bytes
    side_facts = read_facts(sidecar) if sidecar else None
    if side_facts is not None and use_mtp:
        weights += sum(t.n_bytes for t in read_header(side_facts.path).tensors if t.name.startswith("blk."))

    rec = 0
    snapshots = 1 + (MTP_RS_SNAPSHOTS if use_mtp and arch in RS_ROLLBACK_ARCHS else 0)
    if any(recurrent):
        d_state = int(meta.get(f"{arch}.ssm.state_size", 0))
        groups = int(meta.get(f"{arch}.ssm.group_count", 1))
        dt_rank = int(meta.get(f"{arch}.ssm.time_step_rank", 1))
        d_conv = int(meta.get(f"{arch}.ssm.conv_kernel", 4))
        conv_dim = 2 * d_state * groups + d_state * dt_rank
        per_layer = 4 * ((d_conv - 1) * conv_dim + d_state * d_state * dt_rank)
        rec = per_layer * sum(1 for r in recurrent if r)  # one sequence's state

    masks = 2 if any(window_layers) else 1  # windowed layers get a mask of their own, full-size cache or not
    n_embd = facts.n_embd
    n_ff = int(meta.get(f"{arch}.feed_forward_length", 4 * n_embd)) if not isinstance(
        meta.get(f"{arch}.feed_forward_length"), list) else max(meta[f"{arch}.feed_forward_length"])
    if f"{arch}.expert_count" in meta and int(meta.get(f"{arch}.leading_dense_block_count", 0)) < n_trunk:
        ff_active = int(meta.get(f"{arch}.expert_feed_forward_length", n_ff)) * int(
            meta.get(f"{arch}.expert_used_count", 1))
    else:
        ff_active = n_ff
    # hyper-connection models (deepseek4, qwen4exp) carry n_embd_out = hc·n_embd wide residuals
    wide = facts.n_embd_out
    heads = (side_facts.nextn_layers if side_facts else facts.nextn_layers) if use_mtp else 0
    free = available if available is not None else available_memory()

    def at(n_ctx: int, n_seq: int) -> MemoryEstimate:
        kv_per_layer = n_ctx * (dk + dv) * 2  # f16 K and V, per KV head
        cells = window_cells(n_swa, n_ctx, n_seq, kv_unified)
        window = cells * (dk + dv) * 2
        kv_cache = sum((window if windowed[i] else kv_per_layer) * kv_heads[i]
                       for i in range(n_trunk) if not recurrent[i])
        # a window copy holds one sequence's window of the windowed layers' cells (llama.cpp writes no cell
        # the window has left)
        window_copy = sum(min(n_ctx // max(1, n_seq), n_swa) * (dk + dv) * 2 * kv_heads[i]
                          for i in range(n_trunk) if windowed[i])
        checkpoints = CHECKPOINTS_KEPT * n_seq * (rec if hybrid else window_copy)
        mask_bytes = n_ctx * N_UBATCH * 2
        # a windowed cache's mask spans its cells only
        swa_mask = cells * N_UBATCH * 2 if any(windowed) else mask_bytes
        compute = mask_bytes + (masks - 1) * swa_mask + N_UBATCH * 4 * (4 * wide + 3 * ff_active)
        # its input and exported hidden rows are n_embd_out wide (hc·n_embd with hyper-connections)
        mtp_ctx = heads * kv_per_layer * kv_heads[-1] + mask_bytes + N_UBATCH * 4 * (9 * wide // 2) if use_mtp else 0
        # each sequence's recurrent state, and with MTP its snapshots to roll back to (n_rs_seq)
        recurrent_state = rec * n_seq * snapshots
        return MemoryEstimate(weights, kv_cache, recurrent_state, mtp_ctx, compute, free, checkpoints)

    return [at(n, k) for n, k in zip(n_ctxs, n_seqs, strict=True)]


_MEASURE = """
import sys
from engine.runtime import native
native.set_verbose(True)
from engine.generation.session import LoadOptions, Session
s = Session(LoadOptions(path=sys.argv[1], n_ctx=int(sys.argv[2]), mtp=sys.argv[3] == "1",
                        sidecar=sys.argv[4] or None, swa_full=sys.argv[5] == "1", parallel=int(sys.argv[6]),
                        kv_unified=sys.argv[7] == "1"))
s.close()
"""
_BUFFER = re.compile(r"(\w+) buffer size =\s+([\d.]+) MiB")


def measure(path: str | Path, *, n_ctx: int = 4096, sidecar: str | Path | None = None,
            mtp: bool = True, swa_full: bool = False, n_seq: int = 1, kv_unified: bool = True) -> dict[str, float]:
    """What llama.cpp reports allocating, by buffer kind (MiB), loading in a child process (``n_seq``
    sequences of ``n_ctx`` tokens each, in one pool of cells or, not ``kv_unified``, a pool each)."""
    proc = subprocess.run([sys.executable, "-c", _MEASURE, str(path), str(n_ctx), "1" if mtp else "0",
                           str(sidecar or ""), "1" if swa_full else "0", str(n_seq), "1" if kv_unified else "0"],
                          capture_output=True, text=True, timeout=600)
    totals: dict[str, float] = {}
    for kind, size in _BUFFER.findall(proc.stderr):
        totals[kind] = totals.get(kind, 0.0) + float(size)
    return totals
