"""n-gram drafting and MTP + n-gram composition on real models.

1. On every architecture the engine claims (tiny synthetic models): greedy
   output with ``ngram`` and ``mtp+ngram`` is plain greedy output (judged by
   engine/generation/identity.py), and per-source counts add up.
2. Without an MTP head (a trunk file, the built-in Gemma model) n-gram
   drafting still drafts, hybrid targets included (their rollback needs
   recurrent snapshots or checkpoints without MTP).
3. On a prompt that quotes itself the n-gram source's drafts are accepted.
4. Seeded sampling with penalties: drafts go through the same acceptance rule
   as MTP's, so the reply is the seeded plain reply.
"""

from __future__ import annotations

from functools import partial

import pytest

from engine.generation import identity
from engine.generation.session import LoadOptions, Session
from engine.sampling import SamplingParams
from engine.speculative.settings import SpeculativeSettings, ngram
from engine.speculative.stats import StatsSnapshot
from tests.engine import conftest
from tests.engine.conftest import ALL_MTP_ARCHS, ARCHS, synth
from tests.engine.seeded import assert_same_sampling, record_sampled_rows

PROMPT = " the river model"
N_TOKENS = 32
run = partial(conftest.run, prompt=PROMPT, max_tokens=N_TOKENS)  # plain unless a drafter is asked
QUOTE = ("The committee approved the new budget for the city library on Tuesday. "
         "The committee approved the new budget for the city library on Tuesday. "
         "The committee approved the new budget for the city library on Tuesday. The committee")


SAMPLED = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=3)


def assert_sources_add_up(s: StatsSnapshot) -> None:
    assert sum(s.drafted_by_source.values()) == s.drafted
    assert sum(s.accepted_by_source.values()) == s.accepted
    assert sum(s.rounds_by_source.values()) == s.rounds
    assert set(s.drafted_by_source) <= {"mtp", "ngram"}


@pytest.mark.parametrize("arch", ALL_MTP_ARCHS)
def test_ngram_and_composition_keep_the_greedy_output_on_every_architecture(arch):
    session = Session(LoadOptions(path=str(synth(arch, "mixed", agree=0.7).path("combined")), n_ctx=256))
    try:
        assert session.mtp_drafter is not None, session.mtp_unavailable_reason
        noise = identity.measure_noise(session)
        plain = run(session, record_margins=True)
        # A tiny model's reply rarely repeats itself in 32 tokens: give the
        # persistent map another (sampled) reply to the same prompt, which
        # the greedy reply partly follows, so drafts are made and some refused.
        run(session, ngram(8), sampling=SAMPLED)
        for spec in (ngram(4), ngram(4, mtp_too=True), ngram(8)):
            result = run(session, spec)
            verdict = identity.classify(plain.tokens, plain.margins, result.tokens, noise)
            assert verdict.acceptable, f"{spec.label}: {verdict.describe()}"
            stats = result.stats.snapshot()
            assert stats.rounds > 0, spec.label
            assert_sources_add_up(stats)
            if not spec.uses_mtp:
                assert set(stats.drafted_by_source) == {"ngram"}
    finally:
        session.close()


@pytest.mark.parametrize("arch", ARCHS)
def test_ngram_drafts_on_a_model_without_an_mtp_head(arch):
    # the trunk of the sidecar layout has no NextN block; hybrid targets need a rollback without MTP
    session = Session(LoadOptions(path=str(synth(arch, "mixed", agree=0.7).path("trunk")), n_ctx=256))
    try:
        assert session.mtp_drafter is None
        noise = identity.measure_noise(session)
        plain = run(session, record_margins=True)
        run(session, ngram(8), sampling=SAMPLED)  # another reply in the map (see above)
        for spec in (ngram(6), ngram(6, mtp_too=True)):  # mtp+ngram falls back to n-gram alone
            result = run(session, spec)
            assert identity.classify(plain.tokens, plain.margins, result.tokens, noise).acceptable, spec.label
            assert result.stats.settings == SpeculativeSettings("ngram", 6)
            assert result.stats.rounds > 0 and result.stats.drafted_by_source.keys() == {"ngram"}
        assert session.rollback_strategy in (("rs_seq", "checkpoint") if session._hybrid else ("kv",))
    finally:
        session.close()


@pytest.fixture(scope="module")
def gemma(default_model):
    session = Session(LoadOptions(path=str(default_model), n_ctx=1024, n_threads=1))
    yield session
    session.close()


def test_the_default_model_drafts_with_ngrams_on_a_prompt_that_quotes_itself(gemma):
    assert gemma.mtp_drafter is None  # no MTP head: n-gram drafting is its speculation
    noise = identity.measure_noise(gemma)
    plain = run(gemma, prompt=QUOTE, max_tokens=40, record_margins=True)
    for spec in (ngram(8), ngram(8, mtp_too=True)):
        result = run(gemma, spec, prompt=QUOTE, max_tokens=40)
        verdict = identity.classify(plain.tokens, plain.margins, result.tokens, noise)
        assert verdict.acceptable, f"{spec.label}: {verdict.describe()}"
        s = result.stats.snapshot()
        assert s.accepted > 0 and s.accepted_by_source["ngram"] == s.accepted
        assert s.drafted_by_source == {"ngram": s.drafted}
        assert s.rounds < len(result.tokens) // 2  # most tokens came from accepted drafts


PENALISED = SamplingParams(temperature=0.8, top_k=0, top_p=1.0, min_p=0.0, seed=7, repeat_penalty=1.3,
                           repeat_last_n=32, presence_penalty=0.4, frequency_penalty=0.3)


@pytest.mark.parametrize("arch", ["glm4moe", "qwen35"])
def test_seeded_sampling_with_ngram_drafts_is_seeded_plain_sampling(arch, monkeypatch):
    # equal up to a parting, and a parting only where the sampled rows' logits differ (tests/engine/seeded.py)
    session = Session(LoadOptions(path=str(synth(arch, "mixed", seed=1).path()), n_ctx=256))
    rows = record_sampled_rows(session, monkeypatch)
    try:
        session.prefix.forget()
        plain = run(session, sampling=PENALISED, max_tokens=48)
        plain_rows = list(rows)
        run(session, ngram(8), max_tokens=48)  # the greedy reply in the map: the sampled one partly follows it
        rejected = False
        for spec in (ngram(4), ngram(4, mtp_too=True)):
            session.prefix.forget()  # both runs prefill the same way: only verify rows differ from plain's
            rows.clear()
            result = run(session, spec, sampling=PENALISED, max_tokens=48)
            assert_same_sampling(plain.tokens, plain_rows, result.tokens, rows, spec.label)
            assert result.stats.rounds > 0
            rejected |= result.stats.accepted < result.stats.drafted
        assert rejected  # some draft was refused by the sampler: the rule was exercised, not bypassed
    finally:
        session.close()


@pytest.mark.parametrize("arch", ["qwen3next", "deepseek4", "glm4moe", "step35"])
def test_deferring_and_settling_the_mtp_catch_up_leaves_mtp_drafts_unchanged(arch, monkeypatch):
    # Under mtp+ngram the MTP drafter defers its catch-up (folded where the
    # graph allows, else caught up in one batch before it drafts); the backlog
    # is settled in one decode before it outgrows a batch. Caught up at once
    # after every verify, or deferred and settled after every n-gram round,
    # MTP must draft the same tokens round by round. (Folding here depends on
    # the engine build: glm4moe folds only on the patched one; step35 is chained.)
    from engine.speculative import compose

    session = Session(LoadOptions(path=str(synth(arch, "mixed", agree=0.7).path("combined")), n_ctx=256))
    try:
        assert session.mtp_drafter is not None

        def drafts() -> tuple[list[tuple[int, ...]], list[int]]:
            session.drafters.composed = None  # rebuilt with the patched constants
            session.ngram_drafter.forget()
            run(session, ngram(8), sampling=SAMPLED, max_tokens=64)
            # long enough that an MTP round keeps a draft right before an n-gram round: a backlog to settle
            result = run(session, ngram(3, mtp_too=True), record_drafts=True, max_tokens=160)
            return result.drafts_per_round, result.tokens

        run(session, ngram(8))  # make the n-gram drafter
        settled = []
        real_settle = session.mtp_drafter.settle
        monkeypatch.setattr(session.mtp_drafter, "settle", lambda: (settled.append(session.mtp_drafter.backlog),
                                                                real_settle()))
        monkeypatch.setattr(compose, "DEFER_CATCH_UP", False)
        immediate = drafts()
        monkeypatch.setattr(compose, "DEFER_CATCH_UP", True)
        monkeypatch.setattr(compose, "BACKLOG_SHARE", 0.0)
        settled.clear()
        deferred = drafts()
        assert len(settled) >= 2 and max(settled) > 0, settled
        assert deferred == immediate
    finally:
        session.close()
