"""Probabilistic draft sampling on the real engine: sampled MTP drafts kept by rejection sampling.

The models are oracle models whose LM heads are scaled down (``logit_scale``), so that sampling at
temperature 1 spreads over several tokens, and whose heads agree with the target on 70 % of tokens:
where a head agrees, its processed distribution q equals the target's p (rejection sampling keeps
every such draft, matching keeps it only when the target happens to sample the head's top token);
where it disagrees, q puts its mass elsewhere and the residual decides.
"""

from __future__ import annotations

from functools import cache
from statistics import mean

import pytest

from engine.generation.generator import GenerateRequest, GenerateResult, generate
from engine.generation.session import Session
from engine.sampling import SamplingParams
from engine.speculative.settings import MATCH, PROBABILISTIC, SPECULATION_OFF, SpeculativeSettings, mtp
from engine.synth import HeadMap, SynthModel, SynthSpec
from tests.engine.conftest import heads_for, open_session

PROMPT = "the quick brown fox"
SEEDS = range(6)


@cache
def model(arch: str) -> SynthModel:
    return SynthModel(SynthSpec(arch=arch, n_heads=heads_for(arch), heads=(HeadMap(agree=0.7),), logit_scale=0.5))


@pytest.fixture(scope="module", params=["glm4moe", "step35", "qwen35"])
def session(request: pytest.FixtureRequest) -> object:
    s = open_session(model(request.param))
    yield s
    s.close()


def reply(session: Session, spec: SpeculativeSettings, sampling: SamplingParams, max_tokens: int = 48,
          **request: object) -> GenerateResult:
    return generate(session, GenerateRequest(prompt=PROMPT, max_tokens=max_tokens, speculative=spec,
                                             sampling=sampling, **request))


def acceptance(session: Session, draft_sampling: str, temperature: float = 1.0) -> float:
    """Mean over seeds of accepted / drafted."""
    rates = []
    for seed in SEEDS:
        r = reply(session, mtp(3, draft_sampling=draft_sampling), SamplingParams(temperature=temperature, seed=seed))
        assert len(r.tokens) == 48 and sum(r.drafted_per_round) > 0
        rates.append(sum(r.accepted_per_round) / sum(r.drafted_per_round))
    return mean(rates)


def test_probabilistic_drafts_accept_more_than_matching_at_temperature_one(session: Session) -> None:
    matched, sampled = acceptance(session, MATCH), acceptance(session, PROBABILISTIC)
    assert sampled > matched + 0.1, (matched, sampled)


def test_the_statistics_name_the_draft_sampling(session: Session) -> None:
    r = reply(session, mtp(3, draft_sampling=PROBABILISTIC), SamplingParams(temperature=1.0, seed=1))
    assert r.stats.settings.draft_sampling == PROBABILISTIC
    assert r.stats.settings.label == "mtp n_max=3 probabilistic"
    r = reply(session, mtp(3), SamplingParams(temperature=1.0, seed=1))
    assert r.stats.settings.label == "mtp n_max=3"


def test_greedy_requests_are_unaffected(session: Session) -> None:
    plain = reply(session, SPECULATION_OFF, SamplingParams())
    for spec in (mtp(3, draft_sampling=PROBABILISTIC), mtp(3, draft_sampling=MATCH)):
        r = reply(session, spec, SamplingParams())
        assert r.tokens == plain.tokens
        assert sum(r.accepted_per_round) > 0
        assert r.stats.settings.draft_sampling == MATCH  # nothing was sampled: the drafts matched


def test_a_seeded_probabilistic_reply_repeats(session: Session) -> None:
    spec, sampling = mtp(3, draft_sampling=PROBABILISTIC), SamplingParams(temperature=0.8, seed=42)
    first, again = reply(session, spec, sampling), reply(session, spec, sampling)
    assert first.tokens == again.tokens
    assert first.accepted_per_round == again.accepted_per_round


def test_sampled_tokens_follow_the_target_as_often_as_plain_sampling() -> None:
    """How often a sampled token is the target's top choice (f of the token before it) is a property
    of the target's distribution alone: with rejection sampling it is plain sampling's, within the
    sampling error. Keeping every draft would pull it toward the heads' wrong choices (the residual's
    exactness is tested on the pure function, tests/engine/test_rejection.py)."""
    m = model("glm4moe")
    f = m.maps.f
    s = open_session(m)
    try:
        def top_rate(spec: SpeculativeSettings) -> tuple[int, int]:
            hits = total = 0
            for seed in range(150):
                r = reply(s, spec, SamplingParams(temperature=1.0, seed=seed), max_tokens=12)
                pairs = list(zip(r.tokens, r.tokens[1:], strict=False))
                hits += sum(b == f[a] for a, b in pairs if a < len(f))
                total += sum(1 for a, _ in pairs if a < len(f))
            return hits, total

        plain_hits, plain_total = top_rate(SPECULATION_OFF)
        hits, total = top_rate(mtp(3, draft_sampling=PROBABILISTIC))
    finally:
        s.close()
    plain, sampled = plain_hits / plain_total, hits / total
    assert 0.15 < plain < 0.85  # the target really samples
    error = 4.0 * (plain * (1 - plain) * (1 / plain_total + 1 / total)) ** 0.5
    assert abs(sampled - plain) < error, (plain, sampled, error)


def test_several_sequences_at_once_sample_their_drafts_as_each_would_alone() -> None:
    """The multi-sequence engine runs the same Decoder steps: each seeded request's tokens and
    acceptance are those it has alone (on a session whose cells are the shared pool's size)."""
    from engine.generation.parallel import generate_together
    from engine.generation.session import LoadOptions

    path = str(model("glm4moe").path("combined"))
    reqs = [GenerateRequest(prompt=p, max_tokens=24 + 8 * i, speculative=mtp(3, draft_sampling=PROBABILISTIC),
                            sampling=SamplingParams(temperature=1.0, seed=i))
            for i, p in enumerate([" the river model", " a quiet light", " numbers and words"])]
    with Session(LoadOptions(path=path, n_ctx=512 * 3)) as session:
        solo = [generate(session, r) for r in reqs]
    with Session(LoadOptions(path=path, n_ctx=512, parallel=3)) as session:
        together = generate_together(session, reqs, starts=[0, 0, 2])
    for s, t in zip(solo, together, strict=True):
        assert t.tokens == s.tokens
        assert t.accepted_per_round == s.accepted_per_round
        assert t.stats.settings.label == "mtp n_max=3 probabilistic"
    assert sum(sum(t.accepted_per_round) for t in together) > 0


class _ShadowEveryRound:
    """A depth policy whose every round is a one-token shadow probe; it records what it is told."""

    depth = None
    shadow_probe = True

    def __init__(self) -> None:
        self.hits: list[float] = []

    def new_reply(self, shadow_probes: bool = False) -> None:
        pass

    def choose(self, room: int) -> int:
        return min(1, room)

    def observe(self, n_drafted: int, n_accepted: float, verify_s: float, draft_s: float, round_s: float,
                shadow: bool = False) -> None:
        if shadow:  # the last token has no room for a draft: a plain step
            assert n_drafted == 1
            self.hits.append(n_accepted)


def test_a_sampled_shadow_probe_counts_the_chance_its_draft_would_have_been_kept() -> None:
    # a head that agrees everywhere: q equals p, so rejection sampling keeps every draft, while the
    # plain step draws the head's sample only now and then (exact match said ~0.4 here)
    agreeing = SynthModel(SynthSpec(arch="glm4moe", heads=(HeadMap(agree=1.0),), logit_scale=0.5))
    session = open_session(agreeing)
    try:
        policy = _ShadowEveryRound()
        r = generate(session, GenerateRequest(prompt=PROMPT, max_tokens=32, sampling=SamplingParams(temperature=1.0,
                     seed=4), speculative=mtp(1, draft_sampling=PROBABILISTIC)), policy=policy)
        assert len(r.tokens) == 32 and sum(r.drafted_per_round) == 0  # shadows only: nothing verified
        assert len(policy.hits) >= 25
        assert min(policy.hits) > 0.999, policy.hits

        matching = _ShadowEveryRound()
        generate(session, GenerateRequest(prompt=PROMPT, max_tokens=32, sampling=SamplingParams(temperature=1.0,
                 seed=4), speculative=mtp(1)), policy=matching)
        assert set(matching.hits) <= {0.0, 1.0} and 0.0 in matching.hits  # a matched draft is kept or not
    finally:
        session.close()
