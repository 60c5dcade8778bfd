"""The identity verdict's second look on a MoE target (engine/generation/identity.py).

On the bench glm4moe model every drafting setting parted from plain output on
two prompts "beyond the noise": an expert router at a near tie (gap ~1e-4)
picked another expert under another batch shape and the logits jumped by
units, which one window of spread tokens never measured. ``classify_along``
measures the noise again where the output parted. What must still hold: the
windows cover the generation, and a token that no numeric noise explains is
still a defect.
"""

from __future__ import annotations

from engine.generation import identity
from engine.generation.generator import GenerateRequest, generate, render_prompt
from engine.generation.session import LoadOptions, Session
from tests.engine.conftest import synth

PROMPT = " the river model"


def test_noise_along_covers_each_window_and_a_wrong_token_is_still_a_defect():
    session = Session(LoadOptions(path=str(synth("glm4moe", "mixed", agree=0.7).path("combined")), n_ctx=256))
    try:
        request = GenerateRequest(prompt=PROMPT, max_tokens=24, record_margins=True)
        plain = generate(session, request)
        prompt, _ = render_prompt(session, request, lambda: False)
        full = [*prompt, *plain.tokens]
        start, rows = len(prompt) - 1, 4
        ends = [*range(start + rows, len(full) + 1, rows)]
        ends += [] if ends[-1] == len(full) else [len(full)]
        by_window = [identity.measure_noise(session, full[:end], rows) for end in ends]
        assert identity.measure_noise_along(session, full, start, rows) == max(by_window)

        noise = identity.measure_noise(session)
        assert identity.classify_along(session, prompt, plain.tokens, plain.margins, plain.tokens, noise).kind \
            == identity.IDENTICAL
        index = max(range(len(plain.tokens)), key=lambda i: plain.margins[i])  # the clearest greedy choice
        forged = [*plain.tokens[:index], (plain.tokens[index] + 1) % session.model.n_vocab]
        verdict = identity.classify_along(session, prompt, plain.tokens, plain.margins, forged, noise)
        assert verdict.kind == identity.DEFECT, verdict.describe()
        assert verdict.index == index and verdict.noise >= noise
    finally:
        session.close()


def test_a_parting_that_the_targets_own_batch_shapes_cause_is_a_near_tie():
    # Q4_K_M on x86 takes another matmul path from 4 rows on; the KV cache and recurrent state
    # written that way build up a difference along the text, which no window from a shared prefix sees.
    from engine.speculative.settings import mtp
    from tests.engine.test_synth_native_quant import model_of

    session = Session(LoadOptions(path=str(model_of("qwen35", weights="mixed").path()), n_ctx=512))
    try:
        request = GenerateRequest(prompt=PROMPT, max_tokens=48, record_margins=True)
        plain = generate(session, request)
        prompt, _ = render_prompt(session, request, lambda: False)
        spec = generate(session, GenerateRequest(prompt=PROMPT, max_tokens=48, speculative=mtp(4)))
        noise = identity.measure_noise(session)
        verdict = identity.classify_along(session, prompt, plain.tokens, plain.margins, spec.tokens, noise)
        assert verdict.acceptable, verdict.describe()
        if verdict.kind == identity.NEAR_TIE:
            # the parting is the target's own: plain's tokens, no drafter, in batches of 4 rows give
            # the speculative run's token at that row
            from engine.runtime import Batch

            session.prepare(mtp=False)
            target, at = session.target, verdict.index
            batch = Batch(max(target.n_batch, 4))
            target.clear()
            batch.clear()
            for k, tok in enumerate(prompt):
                batch.add(tok, k, False)
            target.decode(batch)
            fed = plain.tokens[:at]
            for start in range(0, len(fed), 4):
                batch.clear()
                for k, tok in enumerate(fed[start:start + 4]):
                    batch.add(tok, len(prompt) + start + k, True)
                target.decode(batch)
            import numpy as np

            logits = np.ctypeslib.as_array(target.logits(batch.n - 1), shape=(session.model.n_vocab,))
            assert int(logits.argmax()) == spec.tokens[at] != plain.tokens[at]
            target.clear()
    finally:
        session.close()


def test_noise_is_measured_after_a_prefix_longer_than_the_contexts_batch():
    """A session loaded with a small batch (prompt chunks of 16 tokens) read the prefix in one decode
    larger than its batch, and llama.cpp aborted the process (GGML_ASSERT n_tokens_all <= n_batch). The
    prefix is read in chunks of the batch, and the noise is about what one large batch measures."""
    path = str(synth("glm4moe", "mixed", agree=0.7).path("combined"))
    tokens = [(11 + 7 * i) % 200 + 3 for i in range(60)]
    with Session(LoadOptions(path=path, n_ctx=256, n_batch=16)) as small, \
            Session(LoadOptions(path=path, n_ctx=256)) as large:
        assert small.target.n_batch < len(tokens) - 9
        chunked, whole = identity.measure_noise(small, tokens), identity.measure_noise(large, tokens)
        assert 0 < chunked <= 10 * whole and whole <= 10 * chunked, (chunked, whole)
