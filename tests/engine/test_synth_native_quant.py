"""K-quant synthetic models (Q4_K_M, Q5_K_M, Q6_K), quantized by llama.cpp's
own quantizer in a child process: the MTP blocks are quantized too, the real
llama.cpp loads and drafts with them, greedy output with MTP is identical to
plain output, and oracle models (maps recomputed from the dequantized file)
accept exactly what the simulator predicts."""

from __future__ import annotations

import pytest

from engine.generation import identity
from engine.generation.generator import GenerateRequest, generate, render_prompt
from engine.generation.session import LoadOptions, Session
from engine.speculative.settings import SPECULATION_OFF, mtp
from engine.synth import HeadMap, SynthModel, SynthSpec, simulate
from engine.synth.native_quant import NativeQuantError, quantize
from engine.synth.spec import default_heads

PROMPT = " the river model"
N_TOKENS = 48


def model_of(arch: str, weights: str = "oracle", agree: float = 1.0, dtype: str = "q4_k_m") -> SynthModel:
    return SynthModel(SynthSpec(arch=arch, size=f"tiny-{dtype}", weights=weights, n_heads=default_heads(arch),
                                heads=(HeadMap("token", agree),)))


def tensor_types(path) -> dict[str, str]:
    import gguf

    return {t.name: t.tensor_type.name for t in gguf.GGUFReader(path).tensors}


def test_llama_cpp_quantizes_every_block_mtp_included_to_q4_k_m():
    import gguf

    model = model_of("glm4moe")
    path = model.path()
    types = tensor_types(path)
    n = model.spec.dims.n_trunk  # the MTP block
    assert types["token_embd.weight"] == "Q4_K" and types["output.weight"] == "Q6_K"  # llama.cpp's Q4_K_M choice
    assert types["blk.0.attn_q.weight"] == "Q4_K" and types["blk.0.ffn_up_exps.weight"] == "Q4_K"
    assert types[f"blk.{n}.nextn.eh_proj.weight"] == "Q4_K"
    assert types[f"blk.{n}.nextn.shared_head_head.weight"] == "Q4_K"
    assert types[f"blk.{n}.nextn.enorm.weight"] == "F32" and types["output_norm.weight"] == "F32"
    field = gguf.GGUFReader(path).get_field("general.file_type")
    assert field is not None and field.contents() == gguf.LlamaFileType.MOSTLY_Q4_K_M


@pytest.mark.parametrize("arch, agree", [("glm4moe", 1.0), ("glm4moe", 0.6), ("qwen35", 0.6), ("step35", 0.6)])
def test_a_q4_k_m_oracle_model_accepts_what_the_simulator_predicts(arch, agree):
    model = model_of(arch, agree=agree)
    session = Session(LoadOptions(path=str(model.path()), n_ctx=512))
    try:
        assert session.mtp_drafter is not None
        prompt = session.model.tokenize(PROMPT)
        plain = generate(session, GenerateRequest(prompt=PROMPT, max_tokens=N_TOKENS, speculative=SPECULATION_OFF))
        expected, token = [], prompt[-1]
        for _ in range(N_TOKENS):
            token = model.maps.f[token]
            expected.append(token)
        assert plain.tokens == expected
        for n_max in (1, 3):
            result = generate(session, GenerateRequest(prompt=PROMPT, max_tokens=N_TOKENS, speculative=mtp(n_max)))
            tokens, rounds = simulate(model.maps, prompt[-1], prompt[-2], N_TOKENS, n_max,
                                      chained=default_heads(arch) > 1)
            assert result.tokens == tokens == plain.tokens
            assert result.accepted_per_round == rounds, f"n_max={n_max}"
            assert result.stats.accepted == sum(rounds) > 0
    finally:
        session.close()


@pytest.mark.parametrize("dtype", ["q5_k_m", "q6_k"])
def test_other_k_quants_load_and_draft_exactly(dtype):
    model = model_of("glm4moe", dtype=dtype)
    path = model.path()
    assert tensor_types(path)["blk.0.attn_q.weight"] == dtype.split("_")[0].upper() + "_K"
    session = Session(LoadOptions(path=str(path), n_ctx=512))
    try:
        plain = generate(session, GenerateRequest(prompt=PROMPT, max_tokens=N_TOKENS, speculative=SPECULATION_OFF))
        result = generate(session, GenerateRequest(prompt=PROMPT, max_tokens=N_TOKENS, speculative=mtp(3)))
        assert result.tokens == plain.tokens
        assert result.stats.accepted == result.stats.drafted > 0
    finally:
        session.close()


def test_mixed_weights_and_sidecar_layout_hold_the_quantizers_bytes_and_stay_exact():
    import gguf
    import numpy as np

    model = model_of("qwen35", weights="mixed")
    combined = {t.name: t for t in gguf.GGUFReader(model.path()).tensors}
    trunk, sidecar = model.path("trunk"), model.path("sidecar")
    side = gguf.GGUFReader(sidecar).tensors
    assert any(".nextn." in t.name for t in side)
    for t in side:  # the very bytes llama.cpp wrote, not a second quantization
        assert t.tensor_type == combined[t.name].tensor_type and np.array_equal(t.data, combined[t.name].data)
    outputs = []
    for options in (LoadOptions(path=str(model.path()), n_ctx=512),
                    LoadOptions(path=str(trunk), sidecar=str(sidecar), n_ctx=512)):
        session = Session(options)
        try:
            plain = generate(session, GenerateRequest(prompt=PROMPT, max_tokens=N_TOKENS,
                                                      speculative=SPECULATION_OFF, record_margins=True))
            # Mixed weights have near ties, and K-quant kernels round differently from 4 rows on
            # (adaptive depth's batch shapes follow this machine's timings): judged with the noise
            # measured where the outputs part (engine/generation/identity.py)
            noise = identity.measure_noise(session)
            prompt, _ = render_prompt(session, GenerateRequest(prompt=PROMPT), lambda: False)
            for spec in (mtp(2), mtp(4, depth="adaptive")):
                result = generate(session, GenerateRequest(prompt=PROMPT, max_tokens=N_TOKENS, speculative=spec))
                verdict = identity.classify_along(session, prompt, plain.tokens, plain.margins, result.tokens,
                                                  noise)
                assert verdict.acceptable, (spec.label, verdict.describe())
                assert result.stats.rounds > 0
            outputs.append(plain.tokens)
        finally:
            session.close()
    assert outputs[0] == outputs[1]


def test_a_failed_quantization_says_why_and_leaves_no_file(tmp_path):
    src, dst = tmp_path / "broken.gguf", tmp_path / "out.gguf"
    src.write_bytes(b"GGUF" + b"\0" * 60)  # a header with nothing behind it
    with pytest.raises(NativeQuantError, match=r"could not quantize broken.gguf to q4_k_m \(exit 1\)"):
        quantize(src, dst, "q4_k_m")
    assert list(tmp_path.iterdir()) == [src]
