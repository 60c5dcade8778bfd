"""Keys and tensors of each MTP architecture, as llama.cpp's loaders expect them.

Shapes are numpy order (the reverse of ggml's ``{ne0, ne1, ...}``). Each
tensor has a *role* that the weight filler turns into values:

- ``embed``: token embeddings; ``output``: the LM head; ``head_out``: an MTP
  head's own LM head (``nextn.shared_head_head``);
- ``norm``: ones; ``bias0``: zeros; ``ssm_a``: negative decay rates;
- ``writer``: a matrix that writes into the residual stream (attention
  output, FFN down projections, ``ssm_out``) — zero in oracle models;
- ``eh_proj``: the MTP input projection; ``weight``: anything else.

The derived architectures (``engine.synth.derived``) name roles from tensor
names and add two: ``matrix`` (any other matrix: random, small in mixed
models) and ``eh_proj_mix`` (random; ``[I | random]`` in mixed models, so
the head reads the token and the hidden state).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.synth.spec import Size, SynthSpec

SSM_D_STATE = 16
SSM_GROUPS = 2
SSM_DT_RANK = 4
SSM_KERNEL = 4
SLIDING_WINDOW = 16


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    role: str
    head: int = -1  # which MTP head (for head_out / eh_proj)


def _attention(i: int, d: Size, q_factor: int = 1, qk_norm: bool = False) -> list[TensorSpec]:
    hd = d.head_dim
    out = [
        TensorSpec(f"blk.{i}.attn_q.weight", (q_factor * d.n_head * hd, d.n_embd), "weight"),
        TensorSpec(f"blk.{i}.attn_k.weight", (d.n_head_kv * hd, d.n_embd), "weight"),
        TensorSpec(f"blk.{i}.attn_v.weight", (d.n_head_kv * hd, d.n_embd), "weight"),
        TensorSpec(f"blk.{i}.attn_output.weight", (d.n_embd, d.n_head * hd), "writer"),
    ]
    if qk_norm:
        out += [
            TensorSpec(f"blk.{i}.attn_q_norm.weight", (hd,), "norm"),
            TensorSpec(f"blk.{i}.attn_k_norm.weight", (hd,), "norm"),
        ]
    return out


def _dense_ffn(i: int, d: Size) -> list[TensorSpec]:
    return [
        TensorSpec(f"blk.{i}.ffn_gate.weight", (d.n_ff, d.n_embd), "weight"),
        TensorSpec(f"blk.{i}.ffn_up.weight", (d.n_ff, d.n_embd), "weight"),
        TensorSpec(f"blk.{i}.ffn_down.weight", (d.n_embd, d.n_ff), "writer"),
    ]


def _moe_ffn(i: int, d: Size, *, probs_bias: bool, shared_gate: bool) -> list[TensorSpec]:
    e, ff, n = d.n_embd, d.n_ff_exp, d.n_expert
    out = [
        TensorSpec(f"blk.{i}.ffn_gate_inp.weight", (n, e), "weight"),
        TensorSpec(f"blk.{i}.ffn_gate_exps.weight", (n, ff, e), "weight"),
        TensorSpec(f"blk.{i}.ffn_up_exps.weight", (n, ff, e), "weight"),
        TensorSpec(f"blk.{i}.ffn_down_exps.weight", (n, e, ff), "writer"),
        TensorSpec(f"blk.{i}.ffn_gate_shexp.weight", (ff, e), "weight"),
        TensorSpec(f"blk.{i}.ffn_up_shexp.weight", (ff, e), "weight"),
        TensorSpec(f"blk.{i}.ffn_down_shexp.weight", (e, ff), "writer"),
    ]
    if probs_bias:
        out.append(TensorSpec(f"blk.{i}.exp_probs_b.bias", (n,), "bias0"))
    if shared_gate:
        out.append(TensorSpec(f"blk.{i}.ffn_gate_inp_shexp.weight", (e,), "weight"))
    return out


def _gated_delta_net(i: int, d: Size, fused_ba: bool) -> list[TensorSpec]:
    key_dim = SSM_D_STATE * SSM_GROUPS
    value_dim = SSM_D_STATE * SSM_DT_RANK
    conv_dim = 2 * key_dim + value_dim
    out = [
        TensorSpec(f"blk.{i}.attn_qkv.weight", (conv_dim, d.n_embd), "weight"),
        TensorSpec(f"blk.{i}.attn_gate.weight", (value_dim, d.n_embd), "weight"),
        TensorSpec(f"blk.{i}.ssm_conv1d.weight", (conv_dim, SSM_KERNEL), "weight"),
        TensorSpec(f"blk.{i}.ssm_dt.bias", (SSM_DT_RANK,), "weight"),
        TensorSpec(f"blk.{i}.ssm_a", (SSM_DT_RANK,), "ssm_a"),
        TensorSpec(f"blk.{i}.ssm_norm.weight", (SSM_D_STATE,), "norm"),
        TensorSpec(f"blk.{i}.ssm_out.weight", (d.n_embd, value_dim), "writer"),
    ]
    if fused_ba:
        out.append(TensorSpec(f"blk.{i}.ssm_ba.weight", (2 * SSM_DT_RANK, d.n_embd), "weight"))
    else:
        out += [
            TensorSpec(f"blk.{i}.ssm_beta.weight", (SSM_DT_RANK, d.n_embd), "weight"),
            TensorSpec(f"blk.{i}.ssm_alpha.weight", (SSM_DT_RANK, d.n_embd), "weight"),
        ]
    return out


def _nextn(i: int, head: int, d: Size) -> list[TensorSpec]:
    return [
        TensorSpec(f"blk.{i}.nextn.eh_proj.weight", (d.n_embd, 2 * d.n_embd), "eh_proj", head),
        TensorSpec(f"blk.{i}.nextn.enorm.weight", (d.n_embd,), "norm"),
        TensorSpec(f"blk.{i}.nextn.hnorm.weight", (d.n_embd,), "norm"),
        TensorSpec(f"blk.{i}.nextn.shared_head_head.weight", (d.n_vocab, d.n_embd), "head_out", head),
        TensorSpec(f"blk.{i}.nextn.shared_head_norm.weight", (d.n_embd,), "norm"),
    ]


def _is_recurrent(spec: SynthSpec, i: int) -> bool:
    return spec.arch in ("qwen35", "qwen3next") and i < spec.dims.n_trunk and i % 2 == 0


def block_tensors(spec: SynthSpec, i: int) -> list[TensorSpec]:
    """Tensors of block ``i`` (trunk blocks first, then the MTP blocks)."""
    d = spec.dims
    mtp_head = i - d.n_trunk
    out: list[TensorSpec] = [TensorSpec(f"blk.{i}.attn_norm.weight", (d.n_embd,), "norm")]
    if spec.arch == "glm4moe":
        out += _attention(i, d)
        out.append(TensorSpec(f"blk.{i}.post_attention_norm.weight", (d.n_embd,), "norm"))
        if spec.dense and mtp_head < 0:
            out += _dense_ffn(i, d)
        else:  # the MTP graph asserts a MoE block
            out += _moe_ffn(i, d, probs_bias=True, shared_gate=False)
    elif spec.arch == "step35":
        out += _attention(i, d, qk_norm=True)
        out.append(TensorSpec(f"blk.{i}.ffn_norm.weight", (d.n_embd,), "norm"))
        out += _dense_ffn(i, d)
    else:  # qwen35, qwen3next
        out.append(TensorSpec(f"blk.{i}.post_attention_norm.weight", (d.n_embd,), "norm"))
        if _is_recurrent(spec, i):
            out += _gated_delta_net(i, d, fused_ba=spec.arch == "qwen3next")
        else:
            out += _attention(i, d, q_factor=2, qk_norm=True)
        if spec.arch == "qwen35":
            out += _dense_ffn(i, d)
        else:
            out += _moe_ffn(i, d, probs_bias=False, shared_gate=True)
    if mtp_head >= 0:
        out += _nextn(i, mtp_head, d)
    return out


def global_tensors(spec: SynthSpec) -> list[TensorSpec]:
    d = spec.dims
    return [
        TensorSpec("token_embd.weight", (d.n_vocab, d.n_embd), "embed"),
        TensorSpec("output_norm.weight", (d.n_embd,), "norm"),
        TensorSpec("output.weight", (d.n_vocab, d.n_embd), "output"),
    ]


def base_keys(spec: SynthSpec, n_blocks: int, n_nextn: int) -> dict[str, Any]:
    """The keys every architecture's loader reads: sizes, attention, rope, NextN count."""
    d = spec.dims
    return {
        "context_length": 4096,
        "embedding_length": d.n_embd,
        "block_count": n_blocks,
        "feed_forward_length": d.n_ff,
        "attention.head_count": d.n_head,
        "attention.head_count_kv": d.n_head_kv,
        "attention.key_length": d.head_dim,
        "attention.value_length": d.head_dim,
        "attention.layer_norm_rms_epsilon": 1e-6,
        "rope.dimension_count": d.head_dim,
        "rope.freq_base": 10000.0,
        "nextn_predict_layers": n_nextn,
    }


def metadata(spec: SynthSpec, with_mtp: bool = True) -> dict[str, Any]:
    """Architecture keys (without the ``<arch>.`` prefix) for a GGUF of ``spec``.

    ``with_mtp=False`` describes a trunk-only export: no NextN blocks counted.
    """
    d = spec.dims
    n_blocks = d.n_trunk + (spec.n_heads if with_mtp else 0)
    keys = base_keys(spec, n_blocks, spec.n_heads if with_mtp else 0)
    if spec.arch in ("glm4moe", "qwen3next"):
        keys.update({
            "expert_count": d.n_expert,
            "expert_used_count": d.n_expert_used,
            "expert_feed_forward_length": d.n_ff_exp,
        })
    if spec.arch == "glm4moe":
        keys.update({
            "expert_shared_count": 1,
            "leading_dense_block_count": d.n_trunk if spec.dense else 0,
            "expert_gating_func": 2,
            "expert_weights_norm": True,
            "expert_weights_scale": 1.0,
        })
    elif spec.arch == "step35":
        keys.update({
            "expert_feed_forward_length": d.n_ff_exp,
            "attention.sliding_window": SLIDING_WINDOW,
            # alternate sliding-window and full layers; MTP blocks use full attention
            "attention.sliding_window_pattern": [
                (1 if (i < d.n_trunk and i % 2 == 0) else 0) for i in range(n_blocks)
            ],
        })
    else:
        keys.update({
            "ssm.conv_kernel": SSM_KERNEL,
            "ssm.state_size": SSM_D_STATE,
            "ssm.group_count": SSM_GROUPS,
            "ssm.time_step_rank": SSM_DT_RANK,
            "ssm.inner_size": SSM_D_STATE * SSM_DT_RANK,
            "full_attention_interval": 2,
        })
        if spec.arch == "qwen35":
            quarter = d.head_dim // 4
            keys["rope.dimension_sections"] = [quarter, quarter, d.head_dim // 2 - 2 * quarter, 0]
        else:
            keys["expert_shared_feed_forward_length"] = d.n_ff_exp
    return keys
