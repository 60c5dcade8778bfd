"""Tensor values for synthetic models: oracle (exactly predictable) or random.

Oracle weights make every block an identity on the residual stream (every
``writer`` is zero), token embeddings random unit vectors, and the LM heads
such that the row for f(t) holds t's embedding: greedy decoding then follows
f, and each MTP head follows its own map g. After building, the *effective*
maps are recomputed from the final (possibly f16) weights, so the simulator
is fed what the file really does, not what was intended.
"""

from __future__ import annotations

import hashlib

import numpy as np

from engine.synth.archs import TensorSpec
from engine.synth.oracle import OracleMaps
from engine.synth.spec import SynthSpec

MIXED_WRITER_SCALE = 0.12  # residual writers of "mixed" models, relative to random ones
# Derived architectures (engine.synth.derived) do not know which matrices write
# into the residual stream, so in mixed models every "matrix" is scaled down,
# and the MTP input projection is [I | random]: the head reads the token and
# the hidden state, so a wrong hidden state changes drafts. Calibrated so that
# every derived architecture accepts 10-45% of drafts at agree=0.7.
MIXED_MATRIX_SCALE = 0.3
MIXED_HIDDEN_SCALE = 1.0


def _rng(spec: SynthSpec, name: str) -> np.random.Generator:
    digest = hashlib.sha256(f"{spec.seed}:{name}".encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


def _embeddings(spec: SynthSpec) -> np.ndarray:
    d = spec.dims
    e = _rng(spec, "token_embd").standard_normal((d.n_vocab, d.n_embd), dtype=np.float32)
    if spec.weights != "random":
        e /= np.linalg.norm(e, axis=1, keepdims=True)
    return e


class WeightFiller:
    """Produces the array for each tensor of ``spec`` (numpy order, float32)."""

    def __init__(self, spec: SynthSpec, maps: OracleMaps | None) -> None:
        self.spec = spec
        self.maps = maps
        self.embd = _embeddings(spec)

    def _lm_head(self, mapping: list[int]) -> np.ndarray:
        """Rows such that argmax(head @ e_t) = mapping[t] (collisions add up)."""
        d = self.spec.dims
        out = np.zeros((d.n_vocab, d.n_embd), dtype=np.float32)
        for t, target in enumerate(mapping):
            out[target] += self.embd[t] * self.spec.logit_scale
        return out

    def array(self, t: TensorSpec) -> np.ndarray:
        spec, oracle = self.spec, self.spec.weights != "random"
        if t.role == "embed":
            return self.embd
        if t.role == "norm":
            return np.ones(t.shape, dtype=np.float32)
        if t.role == "bias0":
            return np.zeros(t.shape, dtype=np.float32)
        if t.role == "ssm_a":
            return -_rng(spec, t.name).uniform(0.5, 2.0, t.shape).astype(np.float32)
        if spec.weights == "oracle" and t.role == "writer":
            return np.zeros(t.shape, dtype=np.float32)
        if oracle and t.role == "output":
            assert self.maps is not None
            return self._lm_head(self.maps.f)
        if oracle and t.role == "head_out":
            assert self.maps is not None
            return self._lm_head(self.maps.heads[t.head])
        if oracle and t.role == "eh_proj":
            e = spec.dims.n_embd
            w = np.zeros((e, 2 * e), dtype=np.float32)
            offset = e if spec.head(t.head).reads == "hidden" else 0
            w[:, offset:offset + e] = np.eye(e, dtype=np.float32)
            return w
        if t.role == "eh_proj_mix" and spec.weights == "mixed":
            e = t.shape[0]
            w = _rng(spec, t.name).standard_normal(t.shape, dtype=np.float32) * (MIXED_HIDDEN_SCALE / np.sqrt(e))
            w[:, :e] = np.eye(e, dtype=np.float32)
            return w.astype(np.float32)
        fan_in = t.shape[-1]
        scale = 1.0 / np.sqrt(fan_in)
        if t.role == "output" or t.role == "head_out":
            scale *= 4.0  # spread the logits: fewer near-ties in greedy decoding
        if t.role == "writer" and spec.weights == "mixed":
            scale *= MIXED_WRITER_SCALE
        if t.role == "matrix" and spec.weights == "mixed":
            scale *= MIXED_MATRIX_SCALE
        return (_rng(spec, t.name).standard_normal(t.shape, dtype=np.float32) * scale).astype(np.float32)


def effective_map(head: np.ndarray, embd: np.ndarray, n_normal: int, chunk: int = 512) -> list[int]:
    """argmax over the vocabulary of head @ e_t for every token t < ``n_normal``.

    Computed ``chunk`` tokens at a time: at a real vocabulary the whole product
    would be gigabytes of logits (151,936 columns per token).
    """
    head32 = head.astype(np.float32)
    out: list[int] = []
    for start in range(0, n_normal, chunk):
        logits = embd[start:min(start + chunk, n_normal)].astype(np.float32) @ head32.T
        out += [int(x) for x in logits.argmax(axis=1)]
    return out
