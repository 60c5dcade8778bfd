"""The drafting gate (adaptive/batch_gate.py): whole steps timed per way of drafting and batch size."""

from __future__ import annotations

from engine.speculative.adaptive.batch_gate import FULL, MARGIN, PLAIN, POLICY, REVISIT, STRETCH, DraftingGate, band


def run(gate: DraftingGate, n_seq: int, steps: int, rates: dict[str, float]) -> list[str]:
    """``steps`` steps of ``n_seq`` sequences, each making 10 tokens at the rate of the mode the gate chose
    (the policy drafting in each of its steps); what it chose at each."""
    chosen = []
    for _ in range(steps):
        mode = gate.mode(n_seq)
        chosen.append(mode)
        gate.observe(n_seq, 10, 10 / rates[mode])
    return chosen


def stretches(*modes: str) -> list[str]:
    return [m for m in modes for _ in range(STRETCH)]


def test_plain_steps_take_over_where_drafting_loses_and_drafting_is_tried_again():
    gate = DraftingGate()
    chosen = run(gate, 8, STRETCH * (3 + REVISIT + 1 + REVISIT + 1), {POLICY: 100.0, PLAIN: 130.0, FULL: 90.0})
    assert chosen[:3 * STRETCH] == stretches(POLICY, PLAIN, FULL)  # each measured once, then the best kept
    assert chosen[3 * STRETCH:(3 + REVISIT) * STRETCH] == stretches(*[PLAIN] * REVISIT)
    rest = chosen[(3 + REVISIT) * STRETCH:]
    assert rest == stretches(POLICY, *[PLAIN] * REVISIT, FULL)  # the others again after a while, in turn
    assert gate.summary()[8][0] == PLAIN


def test_the_policy_stays_where_it_wins_or_ties():
    gate = DraftingGate()
    wins = run(gate, 1, STRETCH * (3 + REVISIT + 1), {POLICY: 120.0, PLAIN: 100.0, FULL: 110.0})
    assert wins == stretches(POLICY, PLAIN, FULL, *[POLICY] * REVISIT, PLAIN)  # each once, then one again
    tie = run(gate, 4, STRETCH * 6, {POLICY: 100.0, PLAIN: 100.0 * (1 + MARGIN / 2), FULL: 100.0 * (1 + MARGIN / 2)})
    assert tie[3 * STRETCH:] == [POLICY] * (3 * STRETCH)  # within the margin the policy keeps its place
    assert gate.summary()[1][0] == gate.summary()[4][0] == POLICY


def test_every_sequence_drafts_its_full_depth_where_that_beats_the_policy_and_plain_steps():
    """Where the policy's own drafting loses to a fixed depth (some sequences drafting, shallower, a lazy head
    catching up as it resumes), the gate takes the fixed depth's way; plain steps win over it only by the
    margin."""
    gate = DraftingGate()
    chosen = run(gate, 4, STRETCH * 10, {POLICY: 90.0, PLAIN: 100.0, FULL: 115.0})
    assert chosen[3 * STRETCH:] == [FULL] * (7 * STRETCH)
    close = DraftingGate()
    chosen = run(close, 4, STRETCH * 6, {POLICY: 90.0, PLAIN: 100.0 * (1 + MARGIN / 2), FULL: 100.0})
    assert chosen[3 * STRETCH:] == [FULL] * (3 * STRETCH)
    mode, rates = gate.summary()[4]
    assert mode == FULL and {m: round(r) for m, r in rates.items()} == {POLICY: 90, PLAIN: 100, FULL: 115}


def test_a_larger_batch_starts_plain_where_a_smaller_one_found_drafting_lost():
    gate = DraftingGate()
    run(gate, 4, STRETCH * 4, {POLICY: 100.0, PLAIN: 130.0, FULL: 100.0})
    assert gate.summary()[4][0] == PLAIN
    assert run(gate, 6, STRETCH * 4, {POLICY: 100.0, PLAIN: 130.0, FULL: 100.0}) == stretches(PLAIN, POLICY, FULL,
                                                                                               PLAIN)
    assert gate.summary()[8][0] == PLAIN and gate.mode(8) == PLAIN and gate.mode(2) == POLICY  # 6 is judged with 5-8


def test_neighbouring_sizes_are_judged_together():
    """Clients sending back to back move the batch between 5 and 8 sequences: one record decides for all of
    them after its first stretches, as for one size (a record per size had not decided after 8 stretches)."""
    assert [band(n) for n in (1, 2, 3, 4, 5, 8, 9, 16)] == [1, 2, 4, 4, 8, 8, 16, 16]
    gate = DraftingGate()
    chosen = []
    rates = {POLICY: 100.0, PLAIN: 130.0, FULL: 100.0}
    for step in range(STRETCH * 5):
        n = 5 + step % 4
        chosen.append(gate.mode(n))
        gate.observe(n, n, n / rates[chosen[-1]])
    assert chosen[:3 * STRETCH] == stretches(POLICY, PLAIN, FULL)
    assert chosen[3 * STRETCH:] == [PLAIN] * (2 * STRETCH)  # plain, for every size of the band
    assert list(gate.summary()) == [8]


def test_steps_the_policy_kept_plain_are_no_evidence_against_drafting():
    """While the policy is still learning acceptance it keeps most steps plain (a probe now and then); those
    steps, a little slower than plain ones by noise or a probe's row, once made plain "win" the first
    verdict, and the gate then kept plain for REVISIT stretches in which the policy could not learn. They
    count toward its stretch, not its rate: a stretch in which it never drafted measures nothing, and the
    best of the others is kept; once it drafts and wins, it keeps its place."""
    gate = DraftingGate()
    for _ in range(STRETCH):  # learning: plain by choice, slower than plain steps by more than the margin
        assert gate.mode(4) == POLICY
        gate.observe(4, 4, 4 / 90.0, drafted=False)
    assert gate.summary()[4] == (PLAIN, {POLICY: None, PLAIN: None, FULL: None})  # nothing judged
    rates = {POLICY: 120.0, PLAIN: 100.0, FULL: 110.0}
    chosen = run(gate, 4, STRETCH * 2, rates)
    assert chosen == stretches(PLAIN, FULL) and gate.mode(4) == FULL  # the policy's rate unknown: full depth
    chosen = run(gate, 4, STRETCH * (REVISIT + 3), rates)
    assert chosen[REVISIT * STRETCH:] == stretches(POLICY, POLICY, POLICY)  # tried again, drafting: kept
    assert gate.summary()[4][0] == POLICY
