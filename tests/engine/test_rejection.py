"""Rejection-sampling verification is distribution-exact (engine/speculative/rejection.py).

Over many seeds on an 8-token vocabulary, the tokens a round emits are distributed as plain samples
of the target's p (a chi-square test and the total variation, each against a bound computed from
the number of samples), whatever the drafter's q is, and a draft is accepted with probability
Σ min(p, q).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from engine.speculative.rejection import acceptance, draw, judge, verify

V = 8
TRIALS = 20_000
Z = 3.719  # the normal quantile of 1e-4: a fixed-seed test that fails only on a real bias


def _dist(*weights: float) -> np.ndarray:
    w = np.array(weights, dtype=np.float64)
    return w / w.sum()


PAIRS = {
    "different": (_dist(5, 1, 3, 0.5, 2, 1, 4, 0.2), _dist(1, 4, 1, 3, 0.5, 2, 0.3, 1)),
    "q where p has none": (_dist(0, 0, 6, 3, 1, 0, 2, 0), _dist(3, 2, 1, 1, 1, 2, 0.5, 1)),
    "p equals q": (_dist(2, 1, 1, 3, 1, 0.5, 0.5, 1), _dist(2, 1, 1, 3, 1, 0.5, 0.5, 1)),
    "p spread, q peaked": (_dist(1, 1, 1, 1, 1, 1, 1, 1), _dist(40, 1, 0, 0, 1, 0, 0, 0)),
    "disjoint": (_dist(0, 0, 0, 0, 1, 2, 3, 4), _dist(4, 3, 2, 1, 0, 0, 0, 0)),
}


def chi_square_limit(df: int) -> float:
    """The chi-square quantile at 1 - 1e-4 (Wilson–Hilferty)."""
    a = 2.0 / (9.0 * df)
    return df * (1.0 - a + Z * math.sqrt(a)) ** 3


def assert_distributed_as(counts: np.ndarray, p: np.ndarray) -> None:
    """``counts`` (of ``n`` draws) fit ``p``: nothing where p has no mass, chi-square and total
    variation within what ``n`` samples allow."""
    n = int(counts.sum())
    assert n > 0
    assert counts[p == 0].sum() == 0, f"tokens p never emits were emitted: {counts}"
    support = p > 0
    expected = n * p[support]
    chi2 = float(((counts[support] - expected) ** 2 / expected).sum())
    assert chi2 < chi_square_limit(max(1, int(support.sum()) - 1)), (chi2, counts, p)
    # total variation: each cell is off by at most Z standard deviations
    tv = 0.5 * float(np.abs(counts / n - p).sum())
    bound = 0.5 * Z * float(np.sqrt(p * (1 - p) / n).sum())
    assert tv < bound, (tv, bound)


@pytest.mark.parametrize("pair", PAIRS)
def test_one_row_emits_tokens_distributed_as_the_target(pair: str) -> None:
    p, q = PAIRS[pair]
    counts = np.zeros(V)
    accepted = 0
    for seed in range(TRIALS):
        rng = np.random.default_rng(seed)
        d = draw(q, rng)
        ok, token = judge(p, q, d, rng)
        counts[token] += 1
        accepted += ok
        assert ok == (token == d)
    assert_distributed_as(counts, p)
    rate, expected = accepted / TRIALS, acceptance(p, q)
    sigma = math.sqrt(max(expected * (1 - expected), 1e-12) / TRIALS)
    assert abs(rate - expected) <= Z * sigma + 1e-12, (rate, expected)


def test_acceptance_beats_matching_a_greedy_draft_when_p_is_spread() -> None:
    p, q = PAIRS["different"]
    # "sample the target and compare" with the head's top token accepts p(argmax q)
    assert acceptance(p, q) > p[int(q.argmax())]
    assert acceptance(p, p) == pytest.approx(1.0)


def test_a_round_emits_each_row_as_the_target_would() -> None:
    """Three drafts: the token of every row a round reaches is distributed as that row's p (rows are
    fixed here, as for a target whose next distribution does not depend on the prefix)."""
    p_rows = [PAIRS["different"][0], PAIRS["q where p has none"][0], PAIRS["p spread, q peaked"][0],
              PAIRS["disjoint"][0]]
    q_rows = [PAIRS["different"][1], PAIRS["q where p has none"][1], PAIRS["p equals q"][1]]
    counts = np.zeros((len(p_rows), V))
    reached = np.zeros(len(p_rows), dtype=int)
    for seed in range(TRIALS):
        rng = np.random.default_rng(1_000_000 + seed)
        drafts = [draw(q, rng) for q in q_rows]
        n_accepted, token = verify(p_rows, q_rows, drafts, rng)
        for k in range(n_accepted):
            counts[k, drafts[k]] += 1
        counts[n_accepted, token] += 1
        reached[: n_accepted + 1] += 1
    for k, p in enumerate(p_rows):
        assert reached[k] == counts[k].sum()
        assert_distributed_as(counts[k], p)
    # row k is reached when every draft before it was accepted
    expected_reach = TRIALS * np.cumprod([1.0] + [acceptance(p, q) for p, q in zip(p_rows, q_rows, strict=False)])
    assert np.all(np.abs(reached - expected_reach) <= Z * np.sqrt(expected_reach) + 1), (reached, expected_reach)


def test_verify_wants_a_bonus_row_and_a_q_row_per_draft() -> None:
    p, q = PAIRS["different"]
    with pytest.raises(ValueError):
        verify([p], [q], [1], np.random.default_rng(0))
    with pytest.raises(ValueError, match="no mass"):
        judge(p, PAIRS["disjoint"][1], 7, np.random.default_rng(0))


def test_draft_sampling_is_a_checked_setting_that_old_profiles_read_as_matching() -> None:
    from engine.speculative.settings import MATCH, PROBABILISTIC, SpeculativeSettings, mtp

    old = SpeculativeSettings.from_json({"mode": "mtp", "n_max": 3, "n_min": 0, "p_min": 0.0, "depth": "fixed"})
    assert old.draft_sampling == MATCH and not old.probabilistic
    sampled = mtp(3, draft_sampling=PROBABILISTIC)
    assert SpeculativeSettings.from_json(sampled.to_json()) == sampled
    assert sampled.label == "mtp n_max=3 probabilistic" and sampled.probabilistic
    assert sampled.for_sampling(greedy=True).draft_sampling == MATCH
    assert sampled.for_sampling(greedy=False) == sampled
    with pytest.raises(ValueError, match="draft_sampling must be one of"):
        mtp(3, draft_sampling="greedy")
