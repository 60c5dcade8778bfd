"""What a synthetic model is: architecture, size, weights, head maps, layout.

A spec is frozen and hashable; its cache key names the generated files, so
the same spec is generated once per generator version.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, replace

from engine.synth.tokenizer import MAX_ACTIVE

GENERATOR_VERSION = 6  # bump when the files a spec produces change
# Oracle LM heads: the logit of f(t) is this × |h| (~8 at the tiny size) above a random spread; at 2.0
# sampling at temperature 1 nearly always picks f(t)
LOGIT_SCALE = 2.0

# Hand-written tensor lists (engine.synth.archs): every weight has a known role,
# so these also support oracle weights.
ARCHITECTURES = ("glm4moe", "step35", "qwen35", "qwen3next")
# Tensor lists asked of llama.cpp's loader (engine.synth.derived): random and
# mixed weights only.
DERIVED_ARCHITECTURES = ("qwen35moe", "mimo2", "hy_v3", "deepseek2", "deepseek32", "glm-dsa", "cohere2moe",
                         "bailingmoe3", "nemotron_h_moe", "deepseek4", "qwen4exp")
ALL_ARCHITECTURES = ARCHITECTURES + DERIVED_ARCHITECTURES
# Architectures whose MTP graph selects one of several NextN blocks
# (llama_set_nextn_layer_offset): the engine chains them; the rest take one.
CHAINED = {"step35": 3, "mimo2": 2, "hy_v3": 2}  # default head count
# The llama.cpp vendored in llama-cpp-python 0.3.36 keeps per-token recurrent
# snapshots (n_rs_seq) for qwen35 but not for qwen3next (checkpoint fallback).
HYBRID = frozenset({"qwen35", "qwen3next"})


@dataclass(frozen=True)
class HeadMap:
    """How one MTP head drafts in an oracle model.

    Attributes:
        reads: "token" (eh_proj = [I | 0]: the head sees only the input token's
            embedding) or "hidden" (eh_proj = [0 | I]: only the trunk hidden state).
        agree: fraction of tokens on which the head's map equals the target's
            (token reads) or equals f∘f (hidden reads); 1.0 = every draft accepted.
        run: 0 draws each token's agreement on its own, so easy and hard tokens
            alternate at random. ``run > 0`` draws it per stretch of ``run``
            consecutive tokens of the target's own text (its orbit under f):
            a whole stretch is easy (every draft accepted) with probability
            ``agree``, else hard (none). That is text that mixes regimes within
            one reply — quoted code, then reasoning — where the right draft
            depth changes from stretch to stretch.
    """

    reads: str = "token"
    agree: float = 1.0
    run: int = 0


@dataclass(frozen=True)
class Size:
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_trunk: int
    n_vocab: int
    n_expert: int = 4
    n_expert_used: int = 2
    n_ff_exp: int = 64
    dtype: str = "f32"  # f32 | f16 | q8_0 | q4_0 | q4_k_m | q5_k_m | q6_k (engine/synth/quant.py)


SIZES = {
    "tiny": Size(n_embd=64, n_head=4, n_head_kv=2, head_dim=16, n_ff=128, n_trunk=4, n_vocab=512,
                 n_expert=4, n_expert_used=2, n_ff_exp=64, dtype="f32"),
    # Big enough that one decode is memory-bound on a CPU (tens of ms).
    "bench": Size(n_embd=1024, n_head=8, n_head_kv=4, head_dim=128, n_ff=2816, n_trunk=8, n_vocab=4096,
                  n_expert=8, n_expert_used=2, n_ff_exp=512, dtype="f16"),
}

# Real vocabularies: Qwen's 151,936 tokens and Gemma's / Step's 262,144. At 4,096 the LM head, the
# p_min gate and the draft step's costs are unlike any real model's; benchmarks that the adaptive
# policy and autotune learn from should use these.
SIZES["bench-152k"] = replace(SIZES["bench"], n_vocab=151_936)
SIZES["bench-262k"] = replace(SIZES["bench"], n_vocab=262_144)
SIZES["tiny-152k"] = replace(SIZES["tiny"], n_vocab=151_936)  # tests: exact oracle maps at a real vocabulary

# Quantized sizes, as users run models (engine/synth/quant.py): tiny ones for tests.
for _quant in ("q8_0", "q4_0"):
    SIZES[f"bench-{_quant}"] = replace(SIZES["bench"], dtype=_quant)
    SIZES[f"tiny-{_quant}"] = replace(SIZES["tiny"], dtype=_quant)

# K-quants, by llama.cpp's own quantizer from the f16 file (engine/synth/native_quant.py).
# K-quant blocks hold 256 values: tiny's 64-wide rows would all fall back to Q5_0 / Q8_0,
# so the tiny K-quant sizes are 256 wide (every matrix row splits into 256-blocks).
for _quant in ("q4_k_m", "q5_k_m", "q6_k"):
    SIZES[f"bench-{_quant}"] = replace(SIZES["bench"], dtype=_quant)
    SIZES[f"tiny-{_quant}"] = replace(SIZES["tiny"], n_embd=256, head_dim=64, n_ff=256, n_ff_exp=256, dtype=_quant)

# Sizes of "another model", for sidecars made for the wrong target.
for _base, _size in list(SIZES.items()):
    SIZES[f"{_base}-other-embd"] = replace(_size, n_embd=_size.n_embd * 2)
    SIZES[f"{_base}-other-vocab"] = replace(_size, n_vocab=_size.n_vocab + 128)
    SIZES[f"{_base}-other-layers"] = replace(_size, n_trunk=_size.n_trunk + 2)


@dataclass(frozen=True)
class SynthSpec:
    arch: str = "glm4moe"
    size: str = "tiny"
    # oracle: exactly predictable; random: every weight random (acceptance ~0);
    # mixed: oracle maps plus random residual writers, so the context (KV cache,
    # recurrent state) changes some predictions and drafts are partly accepted.
    weights: str = "oracle"
    n_heads: int = 1  # MTP heads (NextN blocks); step35, mimo2 and hy_v3 chain several
    heads: tuple[HeadMap, ...] = field(default_factory=lambda: (HeadMap(),))
    seed: int = 0
    dense: bool = False  # step35/glm4moe: dense FFN instead of MoE where the arch allows
    # oracle LM heads' scale: below LOGIT_SCALE, sampling at temperature 1 spreads over other tokens
    # (greedy still follows f), and the heads' distributions equal the target's where they agree
    logit_scale: float = LOGIT_SCALE

    def __post_init__(self) -> None:
        if self.arch not in ALL_ARCHITECTURES:
            raise ValueError(f"unknown architecture {self.arch!r}; expected one of {ALL_ARCHITECTURES}")
        if self.size not in SIZES:
            raise ValueError(f"unknown size {self.size!r}; expected one of {sorted(SIZES)}")
        if self.weights not in ("oracle", "random", "mixed"):
            raise ValueError("weights must be 'oracle', 'random' or 'mixed'")
        if self.weights == "oracle" and self.arch in DERIVED_ARCHITECTURES:
            raise ValueError(f"{self.arch} supports random and mixed weights (oracle needs a hand-written layout)")
        if self.n_heads < 1 or (self.n_heads > 1 and self.arch not in CHAINED):
            raise ValueError(f"{self.arch} takes exactly one MTP head; only {sorted(CHAINED)} chain heads")
        if len(self.heads) not in (1, self.n_heads):
            raise ValueError("give one HeadMap, or one per head")

    @property
    def derived(self) -> bool:
        """True when the tensor list comes from llama.cpp's loader (engine.synth.derived)."""
        return self.arch in DERIVED_ARCHITECTURES

    @property
    def dims(self) -> Size:
        return SIZES[self.size]

    def head(self, i: int) -> HeadMap:
        return self.heads[i] if len(self.heads) > 1 else self.heads[0]

    def key(self) -> str:
        fields = asdict(self)
        for head in fields["heads"]:  # a field added with its default must not rename every cached model
            if not head["run"]:
                del head["run"]
        if fields["logit_scale"] == LOGIT_SCALE:
            del fields["logit_scale"]
        if self.dims.n_vocab - 2 > MAX_ACTIVE:  # maps over the first MAX_ACTIVE tokens only: new files
            fields["active"] = MAX_ACTIVE
        blob = json.dumps({"v": GENERATOR_VERSION, **fields}, sort_keys=True)
        digest = hashlib.sha256(blob.encode()).hexdigest()[:10]
        return f"{self.arch}-{self.size}-{self.weights}-s{self.seed}-{digest}"

    def with_(self, **changes: object) -> SynthSpec:
        return replace(self, **changes)  # type: ignore[arg-type]


def default_heads(arch: str) -> int:
    """MTP heads a synthetic model of ``arch`` gets unless told otherwise."""
    return CHAINED.get(arch, 1)
