"""The drafting gate (adaptive/batch_gate.py): whole steps timed per mode and batch size."""

from __future__ import annotations

from engine.speculative.adaptive.batch_gate import MARGIN, REVISIT, STRETCH, DraftingGate, band


def run(gate: DraftingGate, n_seq: int, steps: int, policy_rate: float, plain_rate: float) -> list[bool]:
    """``steps`` steps of ``n_seq`` sequences, each making 10 tokens at the rate of the mode the gate chose;
    what it chose at each."""
    chosen = []
    for _ in range(steps):
        drafts = gate.drafts(n_seq)
        chosen.append(drafts)
        gate.observe(n_seq, 10, 10 / (policy_rate if drafts else plain_rate))
    return chosen


def test_plain_steps_take_over_where_drafting_loses_and_drafting_is_tried_again():
    gate = DraftingGate()
    chosen = run(gate, 8, STRETCH * (1 + REVISIT + 1), policy_rate=100.0, plain_rate=130.0)
    assert chosen[:STRETCH] == [True] * STRETCH  # the policy first, then plain to compare, kept while it wins
    assert chosen[STRETCH:(1 + REVISIT) * STRETCH] == [False] * (REVISIT * STRETCH)
    assert chosen[(1 + REVISIT) * STRETCH:] == [True] * STRETCH  # and drafting measured again after a while
    assert gate.summary()[8][0] == "plain"


def test_drafting_stays_where_it_wins_or_ties_and_sizes_are_apart():
    gate = DraftingGate()
    wins = run(gate, 1, STRETCH * (2 + REVISIT + 1), policy_rate=120.0, plain_rate=100.0)
    assert wins.count(False) == 2 * STRETCH  # one stretch to measure plain, one to check it again
    tie = run(gate, 4, STRETCH * 6, policy_rate=100.0, plain_rate=100.0 * (1 + MARGIN / 2))
    assert tie.count(False) == STRETCH  # within the margin drafting keeps its place
    assert gate.summary()[1][0] == gate.summary()[4][0] == "policy"


def test_a_larger_batch_starts_plain_where_a_smaller_one_found_drafting_lost():
    gate = DraftingGate()
    run(gate, 4, STRETCH * 3, policy_rate=100.0, plain_rate=130.0)
    assert gate.summary()[4][0] == "plain"
    assert run(gate, 6, STRETCH * 2, policy_rate=100.0, plain_rate=130.0) == [False] * STRETCH + [True] * STRETCH
    assert gate.summary()[8][0] == "plain" and not gate.drafts(8) and gate.drafts(2)  # 6 is judged with 5-8


def test_neighbouring_sizes_are_judged_together():
    """Clients sending back to back move the batch between 5 and 8 sequences: one record decides for all of
    them after two stretches, as for one size (a record per size had not decided after 8 stretches)."""
    assert [band(n) for n in (1, 2, 3, 4, 5, 8, 9, 16)] == [1, 2, 4, 4, 8, 8, 16, 16]
    gate = DraftingGate()
    chosen = []
    for step in range(STRETCH * 4):
        n = 5 + step % 4
        chosen.append(gate.drafts(n))
        gate.observe(n, n, n / (100.0 if chosen[-1] else 130.0))
    assert chosen[:2 * STRETCH] == [True] * STRETCH + [False] * STRETCH
    assert chosen[2 * STRETCH:] == [False] * (2 * STRETCH)  # plain, for every size of the band
    assert list(gate.summary()) == [8]


def test_steps_the_policy_kept_plain_are_no_evidence_against_drafting():
    """While the policy is still learning acceptance it keeps most steps plain (a probe now and then); those
    steps, a little slower than plain ones by noise or a probe's row, once made plain "win" the first
    verdict, and the gate then kept plain for REVISIT stretches in which the policy could not learn. Only
    steps it drafted in count for it; once it drafts, and drafting wins, it keeps drafting."""
    gate = DraftingGate()
    for _ in range(STRETCH * 4):  # learning: plain by choice, slower than plain steps by more than the margin
        assert gate.drafts(4)
        gate.observe(4, 4, 4 / 90.0, drafted=False)
    assert gate.summary()[4] == ("policy", None, None)  # nothing judged yet
    chosen = []
    for _ in range(STRETCH * 4):  # then it drafts, and that beats plain steps
        chosen.append(gate.drafts(4))
        gate.observe(4, 12 if chosen[-1] else 4, 12 / 110.0 if chosen[-1] else 4 / 100.0)
    assert chosen.count(False) == STRETCH and gate.summary()[4][0] == "policy"
