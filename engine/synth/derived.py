"""Architectures whose tensor lists come from llama.cpp itself (see ``engine.synth.probe``).

The four hand-written architectures (``engine.synth.archs``) support oracle
weights, which need every tensor's role in the residual stream. The other
MTP architectures the engine drives only need *a* loadable file of tiny
dimensions with random or mixed weights, so this module holds just the
hyperparameters per architecture (scaled down from llama.cpp's own fixture,
``tests/test-llama-archs.cpp``), probes the loader for the tensors they imply,
then applies a few fix-ups where the loader's optional tensors and the MTP
graph disagree (``_fixups``). Roles for the weight filler come from names.
"""

from __future__ import annotations

import re
from typing import Any

from engine.synth import archs
from engine.synth.archs import TensorSpec
from engine.synth.probe import ProbedTensor, ProbeResult, probe
from engine.synth.spec import SynthSpec
from engine.synth.tokenizer import build_vocabulary

SWA_WINDOW = 16
# MLA geometry (deepseek2 family, bailingmoe3): a 32-wide latent, 16 rope dims.
MLA_LORA = 32
MLA_ROPE = 16
MLA_NOPE = 32
MLA_V = 32


def _moe(spec: SynthSpec, leading_dense: int = 1) -> dict[str, Any]:
    d = spec.dims
    return {
        "expert_count": d.n_expert,
        "expert_used_count": d.n_expert_used,
        "expert_feed_forward_length": d.n_ff_exp,
        "expert_shared_count": 1,
        "expert_shared_feed_forward_length": d.n_ff_exp,
        "expert_gating_func": 2,  # sigmoid, with an expert-selection bias
        "expert_weights_scale": 1.0,
        "expert_weights_norm": True,
        "leading_dense_block_count": leading_dense,
    }


def _mla() -> dict[str, Any]:
    """Multi-head latent attention; head_count_kv 1 as converted DeepSeek files carry it."""
    return {
        "attention.head_count_kv": 1,
        "attention.q_lora_rank": MLA_LORA,
        "attention.kv_lora_rank": MLA_LORA,
        "attention.key_length": MLA_LORA + MLA_ROPE,
        "attention.value_length": MLA_LORA,
        "attention.key_length_mla": MLA_NOPE + MLA_ROPE,
        "attention.value_length_mla": MLA_V,
        "rope.dimension_count": MLA_ROPE,
    }


def _indexer() -> dict[str, Any]:
    """DeepSeek sparse attention's indexer; top_k above the context keeps every token.
    Its key length must be a multiple of 64, the smallest Hadamard rotation the
    indexer's KV cache builds."""
    return {"attention.indexer.head_count": 2, "attention.indexer.key_length": 64, "attention.indexer.top_k": 8192}


def _swa_pattern(n_trunk: int, n_blocks: int) -> list[int]:
    """Alternating sliding-window (1) and full (0) trunk layers; MTP blocks full."""
    return [1 if (i < n_trunk and i % 2 == 0) else 0 for i in range(n_blocks)]


def metadata(spec: SynthSpec, with_mtp: bool = True) -> dict[str, Any]:
    """Architecture keys (without the ``<arch>.`` prefix) for a derived architecture."""
    d = spec.dims
    n_nextn = spec.n_heads if with_mtp else 0
    n_blocks = d.n_trunk + n_nextn
    keys = archs.base_keys(spec, n_blocks, n_nextn)
    arch = spec.arch
    if arch == "qwen35moe":
        keys.update(archs.metadata(spec.with_(arch="qwen35"), with_mtp))
        keys.update(_moe(spec, leading_dense=0))
    elif arch == "mimo2":
        keys.update(_moe(spec))
        keys.update({"attention.sliding_window": SWA_WINDOW,
                     "attention.sliding_window_pattern": _swa_pattern(d.n_trunk, n_blocks)})
    elif arch == "hy_v3":
        keys.update(_moe(spec))
    elif arch in ("deepseek2", "deepseek32", "glm-dsa"):
        keys.update(_moe(spec))
        keys.update(_mla())
        keys["attention.head_count"] = 2
        if arch != "deepseek2":
            keys.update(_indexer())
    elif arch == "cohere2moe":
        keys.update(_moe(spec))
        keys.update({"attention.sliding_window": SWA_WINDOW, "logit_scale": 1.0,
                     "attention.sliding_window_pattern": _swa_pattern(d.n_trunk, n_blocks)})
    elif arch == "bailingmoe3":
        keys.update(_moe(spec))
        keys.update(_mla())
        # KDA (linear attention) where head_count_kv is 0; layer 0 must be attention
        # (the KDA width comes from layer 0's head count).
        kda = {1, 2}
        keys["attention.head_count"] = [0 if i in kda else 2 for i in range(n_blocks)]
        keys["attention.head_count_kv"] = [0 if i in kda else 1 for i in range(n_blocks)]
        keys.update({"ssm.conv_kernel": 4, "kda.head_dim": 16, "kda.safe_gate": True,
                     "kda.gate_lower_bound": -5.0, "rope.dimension_sections": [2, 3, 3, 0]})
    elif arch == "nemotron_h_moe":
        # layer kinds by per-layer counts: mamba2 (no heads, no FFN), MoE (FFN),
        # attention (heads, no FFN); the MTP block is attention + MoE.
        # head_count stays a scalar: the loader takes widths from layer 0's count.
        pattern = ("mamba", "moe", "attn", "moe")
        kinds = [pattern[i % len(pattern)] for i in range(d.n_trunk)] + ["mtp"] * n_nextn
        keys["attention.head_count_kv"] = [d.n_head_kv if k in ("attn", "mtp") else 0 for k in kinds[:n_blocks]]
        keys["feed_forward_length"] = [d.n_ff if k in ("moe", "mtp") else 0 for k in kinds[:n_blocks]]
        keys.update(_moe(spec, leading_dense=0))
        keys.update({"attention.layer_norm_epsilon": 1e-5, "ssm.conv_kernel": 4, "ssm.inner_size": 2 * d.n_embd,
                     "ssm.state_size": 16, "ssm.time_step_rank": 8, "ssm.group_count": 2})
    elif arch == "qwen4exp":
        # qwen35's delta-net keys plus hyper-connections, the QSA indexer (kept dense: every
        # compress ratio 0) and MoE with a shared expert; no PLE. Per-layer arrays span
        # block_count, the MTP block included (the loader reads them with n_layer_all).
        keys.update(archs.metadata(spec.with_(arch="qwen35"), with_mtp))
        keys.update(_moe(spec, leading_dense=0))
        keys.update({"hyper_connection.count": 4, "hyper_connection.low_rank": 8,
                     "attention.compress_ratios": [0] * n_blocks})
        keys.update(_indexer())
    elif arch == "deepseek4":
        keys.update(_moe(spec, leading_dense=0))
        head = 64  # the KV cache's Hadamard rotation is at least 64 wide
        keys.update({
            "attention.head_count": 4, "attention.head_count_kv": 1,
            "attention.key_length": head, "attention.value_length": head, "rope.dimension_count": head // 2,
            "attention.q_lora_rank": 32, "attention.sliding_window": SWA_WINDOW,
            "attention.output_group_count": 2, "attention.output_lora_rank": 16,
            # one compressed (ratio 4, with indexer) and one heavily compressed trunk layer
            "attention.compress_ratios": ([0, 0, 4, 128] + [0] * n_blocks)[:n_blocks],
            "attention.compress_rope_freq_base": 160000.0,
            "hyper_connection.count": 4, "hyper_connection.sinkhorn_iterations": 2,
            "hyper_connection.epsilon": 1e-6, "hash_layer_count": 0,
            "swiglu_clamp_exp": 10.0, "expert_gating_func": 4,  # sqrtsoftplus
        })
        keys.update(_indexer())
        # An indexer as wide as the attention heads makes llama.cpp build a
        # Hadamard rotation for every KV cache, also the MTP context's empty
        # compressed one, whose zero width then divides by zero (SIGFPE).
        keys["attention.indexer.key_length"] = 2 * head
    else:  # pragma: no cover - guarded by SynthSpec
        raise ValueError(f"{arch} is not a derived architecture")
    return keys


# -- tensors -------------------------------------------------------------------
_DROP = (
    re.compile(r"\.(scale|input_scale)$"),  # per-tensor quantization scales (NVFP4 and the like)
    re.compile(r"\.nextn\.embed_tokens\."),  # optional: the MTP graph falls back to token_embd
    re.compile(r"exp_probs_b_vl"),  # deepseek4's vision-only routing bias
)
_DENSE = re.compile(r"^blk\.\d+\.ffn_(gate|up|down)\.")
_MOE = re.compile(r"^blk\.\d+\.(ffn_\w+(exps|shexp)|ffn_gate_inp|exp_probs_b)")
_BLOCK = re.compile(r"^blk\.(\d+)\.")


def _block(name: str) -> int:
    m = _BLOCK.match(name)
    return int(m.group(1)) if m else -1


def _dense_blocks(spec: SynthSpec) -> set[int]:
    """Blocks given a dense FFN where the loader offers both dense and MoE tensors."""
    n_trunk = spec.dims.n_trunk
    if spec.arch == "mimo2":  # its MTP graph asserts a dense FFN
        return {0, *range(n_trunk, n_trunk + spec.n_heads)}
    return {0}


def _fixups(spec: SynthSpec, tensors: list[ProbedTensor]) -> list[ProbedTensor]:
    """Turn the loader's everything-optional list into the file a converter would write."""
    out = [t for t in tensors if not any(p.search(t.name) for p in _DROP)]
    by_block: dict[int, set[str]] = {}
    for t in out:
        by_block.setdefault(_block(t.name), set()).add(t.name)
    dense = _dense_blocks(spec)
    keep: list[ProbedTensor] = []
    for t in out:
        names = by_block[_block(t.name)]
        both = any(_DENSE.match(n) for n in names) and any(_MOE.match(n) for n in names)
        if both and _block(t.name) in dense and _MOE.match(t.name):
            continue
        if both and _block(t.name) not in dense and _DENSE.match(t.name):
            continue
        keep.append(t)
    if spec.arch == "mimo2":
        keep = _fuse_mtp_qkv(spec, keep)
    return keep


def _fuse_mtp_qkv(spec: SynthSpec, tensors: list[ProbedTensor]) -> list[ProbedTensor]:
    """mimo2's MTP graph asserts a fused ``attn_qkv`` (its trunk takes either); the
    loader's probe, which never sees fused tensors, offers split q/k/v."""
    n_trunk = spec.dims.n_trunk
    out: list[ProbedTensor] = []
    for t in tensors:
        il = _block(t.name)
        if il < n_trunk or not re.match(r"^blk\.\d+\.attn_[qkv]\.", t.name):
            out.append(t)
            continue
        if t.name == f"blk.{il}.attn_q.weight":
            parts = [next(x for x in tensors if x.name == f"blk.{il}.attn_{p}.weight") for p in "qkv"]
            rows = sum(p.ne[1] for p in parts)
            out.append(ProbedTensor(f"blk.{il}.attn_qkv.weight", t.ggml_type, (t.ne[0], rows, 1, 1)))
    return out


def role(name: str) -> str:
    """The weight filler's role for a tensor, from its name (see ``engine.synth.archs``)."""
    if name == "token_embd.weight":
        return "embed"
    if name == "output.weight":
        return "output"
    if ".nextn.shared_head_head." in name:
        return "head_out"
    if ".nextn.eh_proj." in name:
        return "eh_proj_mix"
    if name.endswith(".ssm_a") or name.endswith(".ssm_a.weight"):
        return "ssm_a"
    if name.startswith("rope_freqs") or "norm" in name.rsplit(".", 1)[0].rsplit(".", 1)[-1]:
        return "bias0" if name.endswith(".bias") else "norm"
    if "exp_probs_b" in name or (name.endswith(".bias") and ".ssm_" not in name):
        return "bias0"
    return "matrix"


# deepseek4 counts its NextN layers only when blk.<n_trunk>.nextn.eh_proj exists
# in a file, which a file-less probe never has: the probe sees the MTP block as
# one more trunk block (same tensors), and the NextN tensors are added here.
NEXTN_NOT_PROBED = frozenset({"deepseek4"})


# Architectures whose MTP block only our patched llama.cpp loads (packaging/patches/):
# the unpatched loader reads no tensors past the trunk, so its probe lists none.
MTP_NEEDS_PATCH = {
    "qwen4exp": "its MTP head comes from packaging/patches/0003-qwen4exp-mtp-head.patch; "
                "build the engine with the patch series (packaging/build_engine.py).",
}


def _nextn_tensors(spec: SynthSpec, il: int) -> list[ProbedTensor]:
    """deepseek4's NextN tensors for block ``il``, as its loader creates them."""
    e, v = spec.dims.n_embd, spec.dims.n_vocab
    return [
        ProbedTensor(f"blk.{il}.nextn.eh_proj.weight", 0, (2 * e, e, 1, 1)),
        ProbedTensor(f"blk.{il}.nextn.enorm.weight", 0, (e, 1, 1, 1)),
        ProbedTensor(f"blk.{il}.nextn.hnorm.weight", 0, (e, 1, 1, 1)),
        ProbedTensor(f"blk.{il}.nextn.shared_head_head.weight", 0, (e, v, 1, 1)),
        ProbedTensor(f"blk.{il}.nextn.shared_head_norm.weight", 0, (e, 1, 1, 1)),
    ]


def probe_spec(spec: SynthSpec) -> ProbeResult:
    """What llama.cpp loads for ``spec`` with its MTP blocks (cached per engine build)."""
    result = probe(spec.arch, metadata(spec), build_vocabulary(spec.dims.n_vocab))
    if spec.arch in NEXTN_NOT_PROBED:
        extra = [t for il in range(spec.dims.n_trunk, spec.dims.n_trunk + spec.n_heads)
                 for t in _nextn_tensors(spec, il)]
        return ProbeResult(result.tensors + tuple(extra), result.n_layer - spec.n_heads, spec.n_heads,
                           result.n_embd_out)
    if spec.arch in MTP_NEEDS_PATCH and f"blk.{spec.dims.n_trunk}.nextn.eh_proj.weight" not in result.names():
        raise RuntimeError(f"{spec.arch}: this llama.cpp build loads no MTP block; {MTP_NEEDS_PATCH[spec.arch]}")
    if result.n_layer_nextn != spec.n_heads:
        raise RuntimeError(f"{spec.arch}: llama.cpp sees {result.n_layer_nextn} NextN layers, expected {spec.n_heads}")
    return result


def tensor_specs(spec: SynthSpec) -> list[TensorSpec]:
    """Every tensor of the combined file, in the loader's order, with roles."""
    n_trunk = spec.dims.n_trunk
    out = []
    for t in _fixups(spec, list(probe_spec(spec).tensors)):
        il = _block(t.name)
        head = il - n_trunk if il >= n_trunk else -1
        out.append(TensorSpec(t.name, t.shape, role(t.name), head))
    return out

