"""Adaptive draft depth on the real engine, with tiny synthetic models.

1. Greedy output with adaptive depth is plain greedy output on every
   architecture the engine claims (judged with engine.generation.identity,
   as the fixed depths are in test_mtp_every_arch.py).
2. On oracle models it converges: with a head that always agrees it keeps
   drafting deep and every draft is accepted; with one that never agrees it
   settles on plain steps, drafting only the occasional one-token probe; on
   text that is easy and hard in stretches it drafts deep in the easy ones
   and stops at a hard one's first miss.
3. Sampling with a seed gives the same reply with adaptive depth as without
   speculation (the sampler draws once per emitted token, whatever the depth).
"""

from __future__ import annotations

from functools import partial

import pytest

from engine.generation import identity
from engine.generation.session import LoadOptions, Session
from engine.runtime import SamplingParams
from engine.speculative import adaptive
from engine.speculative.settings import SPECULATION_OFF, mtp
from tests.engine import conftest
from tests.engine.conftest import ALL_MTP_ARCHS, synth

PROMPT = " the river model"
run = partial(conftest.run, prompt=PROMPT, max_tokens=48)  # a reply as the settings (and policy) ask
ADAPTIVE = mtp(4, depth="adaptive")


def fixed_costs(n_max: int) -> adaptive.AdaptiveDepth:
    """A policy whose costs are given, not timed: a verify row costs 0.15 of a one-row decode, a draft
    step 0.05 (depth pays when drafts are accepted). The convergence tests then depend on acceptance
    alone, never on how busy this machine was (timings decide the depth; tests must not)."""
    costs = adaptive.Costs.given({k: 1.0 + 0.15 * (k - 1) for k in range(1, n_max + 2)}, draft_step_s=0.05)
    return adaptive.AdaptiveDepth(n_max, costs=costs)


@pytest.mark.parametrize("arch", ALL_MTP_ARCHS)
def test_adaptive_depth_keeps_greedy_output_on_every_architecture(arch):
    session = Session(LoadOptions(path=str(synth(arch, "mixed", agree=0.7).path()), n_ctx=512))
    try:
        assert session.mtp_drafter is not None, session.mtp_unavailable_reason
        noise = identity.measure_noise(session)
        plain = run(session, SPECULATION_OFF, record_margins=True)
        result = run(session, ADAPTIVE)
        verdict = identity.classify(plain.tokens, plain.margins, result.tokens, noise)
        assert verdict.acceptable, verdict.describe()
        assert result.stats.rounds > 0  # it drafted: the identity was tested with drafts
        assert result.stats.settings == ADAPTIVE.limited_to(session.max_draft)  # what ran: the model's limit applied
        assert result.stats.draft_depth is not None
    finally:
        session.close()


@pytest.mark.parametrize("arch", ["glm4moe", "step35", "qwen35"])
def test_a_head_that_always_agrees_keeps_drafting_deep(arch):
    session = Session(LoadOptions(path=str(synth(arch, "oracle", agree=1.0).path()), n_ctx=512))
    try:
        deepest = session.max_draft
        result = run(session, mtp(min(4, deepest), depth="adaptive"), max_tokens=96, record_drafts=True,
                     policy=fixed_costs(min(4, deepest)))
        plain = run(session, SPECULATION_OFF, max_tokens=96)
        assert result.tokens == plain.tokens
        assert result.stats.accepted == result.stats.drafted > 0  # every draft is accepted
        # past the first rounds it drafts more than one token a round: depth pays when all is accepted
        # (the last rounds may be cut short by what is left of the reply)
        later = result.drafted_per_round[len(result.drafted_per_round) // 2:-2]
        assert later and min(later) >= 2, result.drafted_per_round
        assert result.stats.plain_steps <= 2, result.stats.plain_steps
    finally:
        session.close()


@pytest.mark.parametrize("arch", ["glm4moe", "step35"])
def test_a_head_that_never_agrees_settles_on_plain_steps(arch):
    session = Session(LoadOptions(path=str(synth(arch, "oracle", agree=0.0).path()), n_ctx=512))
    try:
        policy = fixed_costs(min(4, session.max_draft))
        n = 160
        result = run(session, mtp(min(4, session.max_draft), depth="adaptive"), max_tokens=n, policy=policy)
        assert result.tokens == run(session, SPECULATION_OFF, max_tokens=n).tokens
        assert result.stats.accepted == 0
        # it tried, learned, and now drafts only probes: one token, ever rarer
        assert result.stats.rounds >= 1
        assert result.stats.plain_steps >= 0.8 * (result.stats.plain_steps + result.stats.rounds)
        assert all(d == 1 for d in result.drafted_per_round[3:]), result.drafted_per_round
        assert result.stats.rounds <= 3 + n // adaptive.AdaptiveParams().probe_first
        assert result.stats.draft_depth == 0
    finally:
        session.close()


@pytest.mark.parametrize("arch", ["glm4moe", "qwen35"])
def test_text_in_easy_and_hard_stretches_is_followed(arch):
    # the head agrees on whole stretches of 16 tokens of the target's text, or on none of them
    # (seed 2: the reply cycles through 88 tokens of the target's text, easy and hard stretches both)
    session = Session(LoadOptions(path=str(synth(arch, "oracle", agree=0.6, run=16, seed=2).path()), n_ctx=1024))
    try:
        policy = fixed_costs(4)
        n = 320
        plain = run(session, SPECULATION_OFF, max_tokens=n)
        fixed = run(session, mtp(4), max_tokens=n)
        run(session, mtp(4, depth="adaptive"), max_tokens=n, policy=policy)  # the policy learns both kinds of stretch
        result = run(session, mtp(4, depth="adaptive"), max_tokens=n, policy=policy)
        assert result.tokens == plain.tokens == fixed.tokens
        wasted = result.stats.drafted - result.stats.accepted
        fixed_wasted = fixed.stats.drafted - fixed.stats.accepted
        # it drafts deep where the text is easy: most of what a fixed depth of 4 gets accepted ...
        assert result.stats.accepted >= 0.7 * fixed.stats.accepted, (result.stats, fixed.stats)
        assert max(result.drafted_per_round) == 4
        # ... and stops at a hard stretch's first miss: a fraction of the drafts a fixed depth wastes
        assert wasted <= 0.35 * fixed_wasted, (wasted, fixed_wasted)
        assert result.stats.plain_steps > 0
        # it learned that a miss starts a hard stretch
        assert policy.acceptance.q(adaptive.AFTER_MISS)[0] < 0.5 < policy.acceptance.q(adaptive.AFTER_FULL)[0]
    finally:
        session.close()


def test_seeded_sampling_is_the_same_reply_with_adaptive_depth():
    session = Session(LoadOptions(path=str(synth("glm4moe", "mixed", agree=0.7).path()), n_ctx=512))
    try:
        sampling = SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.0, seed=1234)
        plain = run(session, SPECULATION_OFF, max_tokens=64, sampling=sampling)
        result = run(session, ADAPTIVE, max_tokens=64, sampling=sampling)
        assert result.stats.rounds > 0
        assert result.tokens == plain.tokens
    finally:
        session.close()


@pytest.mark.parametrize("arch", ["glm4moe", "step35", "qwen35", "deepseek2"])
def test_deferred_catch_up_of_plain_steps_drafts_what_an_immediate_one_does(arch, monkeypatch):
    # Plain steps (a gated draft here; adaptive depth's depth 0 in use) defer their MTP catch-up to
    # the next draft even without folding. The drafts must be those of catching up at once.
    from engine.speculative.mtp import MTPDrafter

    model = synth(arch, "mixed", agree=0.7, reads="hidden")  # the head reads the hidden state: a wrong one shows
    session = Session(LoadOptions(path=str(model.path()), n_ctx=512, fold=False))
    try:
        spec = mtp(3, p_min=0.9, n_min=2)  # a draft cut short by the gate is dropped: a plain step
        deferred = run(session, spec, max_tokens=64, record_drafts=True)
        assert deferred.stats.plain_steps > 0 and deferred.stats.rounds > 0  # both kinds of step happened

        def at_once(self, tokens, pos_start, row0=0):
            self._deferred_step = False
            self.process(tokens, pos_start, row0)

        monkeypatch.setattr(MTPDrafter, "verified", at_once)
        immediate = run(session, spec, max_tokens=64, record_drafts=True)
        assert deferred.drafts_per_round == immediate.drafts_per_round
        assert deferred.tokens == immediate.tokens
    finally:
        session.close()


@pytest.mark.parametrize("arch", ["glm4moe", "step35", "qwen35", "deepseek2"])
@pytest.mark.parametrize("mode", ["ngram", "mtp+ngram"])
def test_adaptive_depth_with_ngram_drafting_keeps_greedy_output(arch, mode):
    from engine.speculative.settings import SpeculativeSettings

    session = Session(LoadOptions(path=str(synth(arch, "mixed", agree=0.7).path()), n_ctx=512))
    try:
        plain = run(session, SPECULATION_OFF, max_tokens=96)
        result = run(session, SpeculativeSettings(mode, 6, depth="adaptive"), max_tokens=96)
        assert result.tokens == plain.tokens
        assert result.stats.settings == SpeculativeSettings(mode, 6, depth="adaptive").limited_to(session.max_draft)
    finally:
        session.close()


def test_the_probes_benchmark_compares_both_kinds_and_restores_the_session():
    from engine.bench import policies

    session = Session(LoadOptions(path=str(synth("glm4moe", "oracle", agree=0.6, run=16, seed=2).path()), n_ctx=512))
    try:
        lines: list[str] = []
        prompts = [("a", "the river"), ("b", "a model of light")]
        policies.probes(session, prompts, 4, 24, 1, lines.append)
        assert lines[0].split()[:2] == ["category", "plain"] and [ln.split()[0] for ln in lines[1:3]] == ["a", "b"]
        assert lines[-1].startswith("shadow / verified, per pair: median") and "over 2 pairs" in lines[-1]
        # what it swapped in for the comparison is gone again
        assert session.mtp_drafter.shadow_probes is True
    finally:
        session.close()
