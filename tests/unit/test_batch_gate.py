"""The drafting gate (adaptive/batch_gate.py): whole steps timed per way of drafting and batch size."""

from __future__ import annotations

from itertools import groupby

from engine.speculative.adaptive.batch_gate import (
    BACKOFF,
    CUT,
    FULL,
    MARGIN,
    MIN_TRIAL,
    PLAIN,
    POLICY,
    REVISIT,
    STRETCH,
    DraftingGate,
    band,
)


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


def trial(mode: str) -> list[str]:
    """A way tried that clearly lost: stopped after its first few steps."""
    return [mode] * MIN_TRIAL


def runs(chosen: list[str]) -> list[tuple[str, int]]:
    """The modes chosen, as (mode, steps in a row)."""
    return [(mode, len(list(steps))) for mode, steps in groupby(chosen)]


def test_plain_steps_take_over_where_drafting_loses_and_drafting_is_tried_again():
    gate = DraftingGate()
    chosen = run(gate, 8, STRETCH * (3 + 3 * REVISIT) + 3 * MIN_TRIAL, {POLICY: 100.0, PLAIN: 130.0, FULL: 90.0})
    # each measured once, the one far behind cut short; then the best kept
    assert chosen[:2 * STRETCH + MIN_TRIAL] == stretches(POLICY, PLAIN) + trial(FULL)
    # the others again after a while, in turn
    assert runs(chosen[2 * STRETCH + MIN_TRIAL:]) == [(PLAIN, REVISIT * STRETCH), (POLICY, MIN_TRIAL),
                                                      (PLAIN, 2 * REVISIT * STRETCH), (FULL, MIN_TRIAL),
                                                      (PLAIN, STRETCH)]
    assert gate.summary()[8][0] == PLAIN


def test_a_way_far_behind_stops_after_a_few_steps_and_a_close_one_gets_its_stretch():
    """Trying full depth at 8 sequences on a CPU (0.75x of plain steps) cost a whole stretch each time; a way
    tried now stops after MIN_TRIAL steps below CUT of the best other way's rate, and only then."""
    far = run(DraftingGate(), 8, STRETCH * 3, {POLICY: 100.0, PLAIN: 100.0, FULL: 100.0 * CUT * 0.98})
    assert runs(far)[:3] == [(POLICY, STRETCH), (PLAIN, STRETCH), (FULL, MIN_TRIAL)]
    close = run(DraftingGate(), 8, STRETCH * 3, {POLICY: 100.0, PLAIN: 100.0, FULL: 100.0 * CUT * 1.02})
    assert runs(close) == [(POLICY, STRETCH), (PLAIN, STRETCH), (FULL, STRETCH)]
    # a stretch whose first steps ran slow (a lazy head resuming) and the rest fast is judged on all of them
    gate = DraftingGate()
    run(gate, 8, STRETCH * 2, {POLICY: 100.0, PLAIN: 100.0, FULL: 100.0})
    for step in range(STRETCH):
        assert gate.mode(8) == FULL
        gate.observe(8, 10, 10 / (70.0 if step == 0 else 100.0))
    assert gate.mode(8) == POLICY  # the stretch ran whole, then the verdict: full is within the margin of it


def test_revisits_that_confirm_the_best_come_later_each_time_and_a_new_best_starts_over():
    gate = DraftingGate()
    losing = {POLICY: 100.0, PLAIN: 130.0, FULL: 90.0}
    chosen = run(gate, 8, STRETCH * (2 + REVISIT * (1 + 2 + 4 + BACKOFF + BACKOFF)) + 6 * MIN_TRIAL, losing)
    waits = [steps // STRETCH for mode, steps in runs(chosen)[3:] if mode == PLAIN]
    assert waits == [REVISIT * k for k in (1, 2, 4, BACKOFF, BACKOFF)]  # twice as long each time, up to BACKOFF
    assert all(steps == MIN_TRIAL for mode, steps in runs(chosen)[2:] if mode != PLAIN)
    # conditions change: full depth now wins where it is tried next, though it lost every time before (what
    # was measured long ago weighs little against a fresh stretch), and the others are looked at soon again
    chosen = run(gate, 8, STRETCH * REVISIT * (BACKOFF + 1 + 2) + 2 * MIN_TRIAL,
                 {POLICY: 100.0, PLAIN: 130.0, FULL: 200.0})
    assert runs(chosen) == [(PLAIN, BACKOFF * REVISIT * STRETCH), (FULL, REVISIT * STRETCH), (POLICY, MIN_TRIAL),
                            (FULL, 2 * REVISIT * STRETCH), (PLAIN, MIN_TRIAL)]


def test_the_policy_stays_where_it_wins_or_ties():
    gate = DraftingGate()
    wins = run(gate, 1, STRETCH * (2 + REVISIT) + MIN_TRIAL * 2, {POLICY: 120.0, PLAIN: 100.0, FULL: 110.0})
    # each once (plain, below CUT of the policy's rate, cut short), then one again
    assert wins == stretches(POLICY) + trial(PLAIN) + stretches(FULL, *[POLICY] * REVISIT) + trial(PLAIN)
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
    assert run(gate, 6, STRETCH * 3, {POLICY: 100.0, PLAIN: 130.0, FULL: 100.0}) == (
        stretches(PLAIN) + trial(POLICY) + trial(FULL) + stretches(PLAIN)[2 * MIN_TRIAL:] + stretches(PLAIN))
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
    assert chosen[:2 * STRETCH + MIN_TRIAL] == stretches(POLICY, PLAIN) + trial(FULL)
    assert chosen[2 * STRETCH + MIN_TRIAL:] == [PLAIN] * (3 * STRETCH - MIN_TRIAL)  # plain, for every size of the band
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
