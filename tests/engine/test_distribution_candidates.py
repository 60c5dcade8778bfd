"""The processed distributions p and q computed from top-k's candidates equal the whole row's.

At a real vocabulary (151,936 tokens) running llama.cpp's stages over every entry
cost 3-5 ms a row (docs/mtp.md); :func:`engine.runtime.distribution.candidates`
hands them only the tokens top-k can keep. These tests compare the two on the real
stages: logit bias (up and down), penalties that lower and raise logits (a negative
presence penalty), top-k, top-p, min-p and temperature.
"""

from __future__ import annotations

import numpy as np
import pytest

from engine.runtime.distribution import Cuts, TokenRow, candidates
from engine.runtime.sampler import Sampler
from engine.sampling import SamplingParams

N_VOCAB = 151_936


def _row(rng: np.random.Generator, spread: float) -> np.ndarray:
    return (rng.standard_normal(N_VOCAB) * spread).astype(np.float32)


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0.7, top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.1, presence_penalty=0.4),
    SamplingParams(temperature=1.0, top_k=20, top_p=1.0, min_p=0.0, presence_penalty=-1.5),  # raises seen tokens
    SamplingParams(temperature=1.2, top_k=100, top_p=0.9, min_p=0.0, frequency_penalty=0.8),
    SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.05, repeat_penalty=1.1, presence_penalty=-2.0),
])
def test_the_target_distribution_from_candidates_is_the_whole_rows(params):
    rng = np.random.default_rng(11)
    bias = {int(t): float(b) for t, b in zip(rng.integers(0, N_VOCAB, 6), (8.0, 6.0, -3.0, -100.0, 4.0, 5.0),
                                              strict=True)}
    sampler = Sampler(params, N_VOCAB, n_ctx=512, logit_bias=bias)
    whole = TokenRow(sampler._lib, N_VOCAB)
    try:
        history = [int(t) for t in rng.integers(0, N_VOCAB, 30)]
        sampler.accept_prompt(history)
        compared = 0
        for spread in (0.5, 2.0, 6.0):
            logits = _row(rng, spread)
            # the history's tokens near the top, so the penalties move tokens across top-k's cut
            logits[history[:10]] = logits.max() - rng.uniform(0, 0.3, 10).astype(np.float32)
            before = logits.copy()
            p = sampler.distribution(logits)
            assert np.array_equal(logits, before)
            reference = whole.probabilities(sampler._stages, logits)
            assert np.allclose(p, reference, rtol=1e-6, atol=1e-12), spread
            assert p.sum() == pytest.approx(1.0) and 0 < np.count_nonzero(p) <= (params.top_k or N_VOCAB // 4)
            sampler.accept(int(np.argmax(p)))  # into the history: the next row sees it
            compared += 1
        assert compared == 3
    finally:
        sampler.close()


def test_a_draft_samplers_q_from_candidates_is_the_whole_rows_after_each_draft():
    rng = np.random.default_rng(5)
    params = SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.3,
                            presence_penalty=-0.5, seed=3)
    sampler = Sampler(params, N_VOCAB, n_ctx=512, logit_bias={17: 9.0})
    whole = TokenRow(sampler._lib, N_VOCAB)
    drafts = sampler.draft_sampler()
    try:
        sampler.accept_prompt([int(t) for t in rng.integers(0, N_VOCAB, 20)])
        drafts.start()
        for _ in range(4):
            logits = _row(rng, 3.0)
            # the whole row through the same stages, the penalties as they stand before this draft
            snapshot = sampler._lib.llama_sampler_clone(drafts._clone)
            try:
                stages = [snapshot if s is sampler._penalties else s for s in drafts._stages]
                reference = whole.probabilities(stages, logits)
            finally:
                sampler._lib.llama_sampler_free(snapshot)
            token = drafts.sample(logits)
            assert np.allclose(drafts.rows[-1], reference, rtol=1e-6, atol=1e-12)
            assert reference[token] > 0
        assert 17 in drafts._adjusted
    finally:
        drafts.end()
        sampler.close()


def test_candidates_fall_back_to_the_whole_row_without_top_k_or_for_small_vocabularies():
    logits = np.arange(1000, dtype=np.float32)
    assert candidates(logits, Cuts(), []) is None
    assert candidates(logits, Cuts(top_k=300), []) is None  # a quarter of the row or more: the whole row is as cheap
    picked = candidates(logits, Cuts(top_k=10), [3, 999])
    assert picked is not None and set(picked) == set(range(988, 1000)) | {3}
    assert candidates(logits, Cuts(min_p=0.5, top_p=0.9), []) is None  # top-p's cut needs the whole row's mass
    near = candidates(logits, Cuts(min_p=float(np.exp(-5.0))), [999])  # within 5 of the unadjusted top, 998
    assert near is not None and set(near) == set(range(993, 1000))


def test_plain_greedy_picks_what_llama_cpps_greedy_stage_picks_ties_included():
    from engine.generation.session import LoadOptions, Session
    from engine.runtime.context import Batch
    from engine.sampling import GREEDY
    from tests.engine.conftest import synth

    session = Session(LoadOptions(path=str(synth("glm4moe", "random").path()), n_ctx=256, mtp=False))
    fast = Sampler(GREEDY, session.model.n_vocab, 256)
    chain = Sampler(GREEDY, 0, 256)  # no vocabulary size given: llama.cpp's chain picks
    try:
        assert fast._argmax and not chain._argmax
        batch = Batch(64)
        for i, token in enumerate(session.model.tokenize(" the river model")[:6]):
            batch.add(token, i, True)
        session.target.decode(batch)
        for row in range(batch.n):
            assert fast.sample(session.target.handle, row) == chain.sample(session.target.handle, row)
        logits = np.ctypeslib.as_array(session.target.logits(0), shape=(session.model.n_vocab,))
        logits[[40, 7, 300]] = logits.max() + 1.0  # a three-way tie at the top: the lowest id
        assert fast.sample(session.target.handle, 0) == chain.sample(session.target.handle, 0) == 7
    finally:
        fast.close()
        chain.close()
        session.close()
