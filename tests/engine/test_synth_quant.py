"""Quantized synthetic models (Q8_0, Q4_0): written with gguf's quantizers,
loaded by the real llama.cpp, and still exact oracles — the maps are
recomputed from the dequantized weights, so greedy output follows them."""

from __future__ import annotations

import pytest

from engine.generation.generator import GenerateRequest, generate
from engine.generation.session import LoadOptions, Session
from engine.speculative.settings import SPECULATION_OFF, mtp
from engine.synth import HeadMap, SynthModel, SynthSpec


@pytest.mark.parametrize("dtype", ["q8_0", "q4_0"])
def test_a_quantized_oracle_model_follows_its_map_and_accepts_its_drafts(dtype):
    import gguf

    spec = SynthSpec(arch="glm4moe", size=f"tiny-{dtype}", weights="oracle", heads=(HeadMap("token", 1.0),))
    model = SynthModel(spec)
    path = model.path()
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(path).tensors}
    assert types["output.weight"] == dtype.upper() and types["blk.0.attn_q.weight"] == dtype.upper()
    assert types["output_norm.weight"] == "F32"  # vectors stay f32
    session = Session(LoadOptions(path=str(path), n_ctx=512))
    try:
        prompt = session.model.tokenize(" the river")
        plain = generate(session, GenerateRequest(prompt=" the river", max_tokens=64, speculative=SPECULATION_OFF))
        expected, token = [], prompt[-1]
        for _ in range(64):
            token = model.maps.f[token]
            expected.append(token)
        assert plain.tokens == expected
        for spec in (mtp(3), mtp(4, depth="adaptive")):
            result = generate(session, GenerateRequest(prompt=" the river", max_tokens=64, speculative=spec))
            assert result.tokens == plain.tokens
            assert result.stats.accepted == result.stats.drafted > 0
    finally:
        session.close()
