"""MTP on every architecture the engine claims, on tiny synthetic models.

``engine.gguf.sidecar.MTP_ARCHITECTURES`` lists every architecture whose llama.cpp
graph runs an MTP head. Four have hand-written synthetic layouts; the rest
are generated from what llama.cpp's own loader asks for (engine.synth.derived).
For each, loaded as one file and as trunk + sidecar, with random weights
(every weight random: the head reads the hidden state) and mixed weights
(token maps plus small random writers: drafts are partly accepted):

1. MTP loads (a drafter with the architecture's head count) and generates;
2. greedy output with MTP at n_max 1..4 is plain greedy output, judged with
   engine.generation.identity (a parting at a near tie within the measured
   numeric noise is acceptable, anything else is a defect);
3. the drafts are the same round by round with the catch-up folded into the
   next draft and not: a graph that hands back another row's hidden state to
   a folded batch changes drafts (never tokens), which only this shows.
"""

from __future__ import annotations

from functools import partial

import pytest

from engine.generation import identity
from engine.gguf.sidecar import MTP_ARCHITECTURES
from engine.speculative import mtp
from tests.engine import conftest
from tests.engine.conftest import ALL_MTP_ARCHS, heads_for, open_session, synth

PROMPT = " the river model"
N_TOKENS = 48
run = partial(conftest.run, prompt=PROMPT, max_tokens=N_TOKENS)  # MTP to a depth, or plain with None
AGREE = 0.7  # mixed heads' maps agree with the target's on 70% of tokens


def test_every_claimed_architecture_has_a_synthetic_model():
    assert set(ALL_MTP_ARCHS) == set(MTP_ARCHITECTURES)


IDENTITY_CASES = [
    pytest.param(arch, layout, weights, seed, id=f"{arch}-{layout}-{weights}-s{seed}")
    for arch in ALL_MTP_ARCHS
    for layout in ("combined", "sidecar")
    for weights in ("random", "mixed")
    for seed in (0, 1)
]


@pytest.mark.parametrize("arch, layout, weights, seed", IDENTITY_CASES)
def test_mtp_loads_and_greedy_output_is_the_plain_output(arch, layout, weights, seed):
    session = open_session(synth(arch, weights, agree=AGREE, seed=seed), layout)
    try:
        assert session.mtp_drafter is not None, session.mtp_unavailable_reason
        assert session.n_heads == heads_for(arch)
        noise = identity.measure_noise(session)
        plain = run(session, None, record_margins=True)
        assert plain.tokens
        accepted = drafted = 0
        for n_max in (1, 2, 3, 4):
            result = run(session, n_max)
            verdict = identity.classify(plain.tokens, plain.margins, result.tokens, noise)
            assert verdict.acceptable, f"n_max={n_max}: {verdict.describe()}"
            assert result.stats.rounds > 0
            accepted, drafted = accepted + result.stats.accepted, drafted + result.stats.drafted
        if weights == "mixed":  # partial acceptance: counts mean something
            assert 0 < accepted < drafted, (accepted, drafted)
    finally:
        session.close()


# Chained heads never fold; mimo2 and hy_v3 with one head do, so they are
# checked that way too.
FOLD_CASES = [
    pytest.param(arch, heads_for(arch), layout, weights, id=f"{arch}-h{heads_for(arch)}-{layout}-{weights}")
    for arch in ALL_MTP_ARCHS
    for layout, weights in (("combined", "random"), ("combined", "mixed"), ("sidecar", "random"))
] + [
    pytest.param(arch, 1, "combined", weights, id=f"{arch}-h1-combined-{weights}")
    for arch in ("mimo2", "hy_v3")
    for weights in ("random", "mixed")
]


def assert_same_drafts(model, layout: str, n_maxes: tuple[int, ...] = (2, 3), expect_fold: bool = False) -> None:
    folded, unfolded = open_session(model, layout), open_session(model, layout, fold=False)
    try:
        assert unfolded.mtp_drafter is not None and not unfolded.mtp_drafter.fold
        # Every single-head graph of the patched engine returns the output row's hidden state, so
        # folding is on and this comparison means something (packaging/patches/0001-mtp-crop-before-export).
        assert folded.mtp_drafter.fold or not expect_fold, "the MTP graph does not crop rows: is the engine patched?"
        for n_max in n_maxes:
            a, b = run(folded, n_max, record_drafts=True), run(unfolded, n_max, record_drafts=True)
            rounds = list(zip(a.drafts_per_round, b.drafts_per_round, strict=False))
            first = next((i for i, (x, y) in enumerate(rounds) if x != y), len(rounds))
            assert a.drafts_per_round == b.drafts_per_round, (
                f"n_max={n_max} fold={folded.mtp_drafter.fold}: round {first} drafted "
                f"{a.drafts_per_round[first:first + 1]} folded, {b.drafts_per_round[first:first + 1]} unfolded"
            )
            assert a.tokens == b.tokens
    finally:
        folded.close()
        unfolded.close()


@pytest.mark.parametrize("arch, n_heads, layout, weights", FOLD_CASES)
def test_drafts_are_the_same_round_by_round_with_folding_on_and_off(arch, n_heads, layout, weights):
    assert_same_drafts(synth(arch, weights, agree=AGREE, n_heads=n_heads), layout, expect_fold=n_heads == 1)


@pytest.mark.parametrize("arch, weights", [("glm4moe", "random"), ("deepseek2", "mixed"), ("hy_v3", "mixed")])
def test_the_fold_comparison_catches_a_stale_hidden_state(arch, weights, monkeypatch):
    # Prove the comparison above can fail: hand a folded batch's draft a
    # previous position's hidden state, as these graphs did before
    # packaging/patches/0001 made them crop before exporting, and the second
    # draft of a round changes. (Reproduced here rather than by trusting the
    # graph, which the patched engine no longer gets wrong.)
    monkeypatch.setattr(mtp, "graph_crops_rows", lambda *a, **k: True)
    # every fold re-decodes id_last's row, so every round's folded batch has several rows (with the row
    # kept, a round after a full miss folds nothing, and on random weights few rounds accept a draft)
    monkeypatch.setattr(mtp.MTPDrafter, "skip_drafted_row", False)
    real_init = mtp.MTPDrafter.__init__

    def init_reading_a_stale_row(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        read = self.ctx.embeddings_nextn_ith
        # a folded batch has several rows: return the state of the row before the output row
        self.ctx.embeddings_nextn_ith = lambda i: self.pending_h.ctypes.data if self.batch.n > 1 else read(i)

    monkeypatch.setattr(mtp.MTPDrafter, "__init__", init_reading_a_stale_row)
    with pytest.raises(AssertionError, match="drafted"):
        assert_same_drafts(synth(arch, weights, agree=AGREE, n_heads=1), "combined", n_maxes=(3,))
