"""Draft depths chosen for a whole batch of sequences (engine/speculative/adaptive/batch.py).

Each test gives acceptance and verify costs by total rows, and checks the choice against
the best total tokens per second found by trying every combination of depths. Draft steps
are shared (one decode of the draft context per step for every sequence drafting that
deep), so a batch pays as many draft steps as its deepest draft.
"""

from __future__ import annotations

import itertools

import pytest

from engine.speculative.adaptive import AdaptiveDepth, Costs
from engine.speculative.adaptive.batch import choose_depths


def costs(per_row: float, fixed: float = 1.0, rows: int = 40, step: float = 0.05) -> Costs:
    """A verify of k rows costs ``fixed + per_row * k``; a draft step ``step``."""
    return Costs.given({k: fixed + per_row * k for k in range(1, rows + 1)}, draft_step_s=step)


def total_rate(q: list[list[float]], depths: tuple[int, ...], c: Costs) -> float:
    expected = 0.0
    for qs, n in zip(q, depths, strict=True):
        reach = 1.0
        expected += 1.0
        for i in range(n):
            reach *= qs[i]
            expected += reach
    return expected / (c.verify(len(q) + sum(depths)) + max(depths) * c.draft_step_s)


def best_by_trying(q: list[list[float]], caps: list[int], c: Costs) -> float:
    return max(total_rate(q, d, c) for d in itertools.product(*(range(cap + 1) for cap in caps)))


@pytest.mark.parametrize("step", [0.05, 0.6])
@pytest.mark.parametrize("per_row", [0.01, 0.1, 0.4, 1.0, 3.0])
@pytest.mark.parametrize("q", [
    [[0.9] * 4, [0.9] * 4, [0.9] * 4, [0.9] * 4],
    [[0.95, 0.9, 0.8, 0.7], [0.3] * 4, [0.6] * 4],
    [[0.5] * 4, [0.99] * 4],
    [[0.9, 0.2, 0.9, 0.9], [0.7] * 4, [0.99, 0.99, 0.5, 0.1]],
])
def test_the_choice_is_as_fast_as_the_best_combination(per_row, q, step):
    c = costs(per_row, step=step)
    caps = [4] * len(q)
    chosen = tuple(choose_depths(q, caps, c))
    assert total_rate(q, chosen, c) >= 0.999 * best_by_trying(q, caps, c), chosen


def test_cheap_rows_draft_deep_and_compute_bound_rows_do_not_draft():
    q = [[0.9] * 4] * 4
    assert choose_depths(q, [4] * 4, costs(per_row=0.01)) == [4, 4, 4, 4]  # a GPU far from compute-bound
    # every row costs what a plain step does (a CPU): a draft row yields 0.9 tokens where a plain one yields 1
    assert choose_depths(q, [4] * 4, costs(per_row=1.0, fixed=0.0)) == [0, 0, 0, 0]


def test_one_sequence_chooses_what_it_would_alone():
    c = costs(per_row=0.3)
    alone = AdaptiveDepth(6, costs=c)
    for _ in range(30):
        alone.observe(6, 6, 1.0, 0.3, 1.3)  # every draft accepted: q_i near 1
    q = alone.acceptance.q()
    assert choose_depths([q], [6], c) == [alone.best(6)]


def test_caps_and_rows_others_add_are_respected():
    q = [[0.9] * 4] * 2
    assert choose_depths(q, [1, 0], costs(per_row=0.01)) == [1, 0]
    # a batch full of other sequences' plain rows, each bringing a token: a draft row that brings less
    # than a token for what a row costs lowers the total (it would not, counted against a nearly empty batch)
    busy = costs(per_row=0.2, fixed=1.0, rows=80)
    assert sum(choose_depths(q, [4, 4], busy)) > 0
    assert sum(choose_depths(q, [4, 4], busy, others=(30, 30.0))) == 0


def test_sequences_share_their_draft_steps():
    """A draft step dear against a row, as a real vocabulary's head makes it: eight sequences drafting in
    the same steps share their cost and draft as one alone would, where paying a step per sequence
    would have cost more than the plain batch (the first version's count: adaptive stopped drafting)."""
    c = costs(per_row=0.02, fixed=1.0, step=0.5)
    q = [[0.9] * 3] * 8
    assert choose_depths(q[:1], [3], c) == [3]
    assert choose_depths(q, [3] * 8, c) == [3] * 8
    per_sequence_steps = (8 * (1 + 0.9 + 0.81 + 0.729)) / (c.verify(32) + 8 * 3 * 0.5)
    assert per_sequence_steps < total_rate(q, (0,) * 8, c) < total_rate(q, (3,) * 8, c)


def test_a_batch_that_never_timed_one_row_prices_extra_rows_by_the_prior_s_shape():
    """Eight sequences verify eight rows at least, so a one-row verify is never timed. Extra rows are priced
    from the smallest size timed by the prior's shape; taking that whole batch for "one row" priced each
    extra row at 0.4 of the batch, and eight sequences whose every draft is kept never drafted."""
    from engine.speculative.adaptive import AdaptiveParams

    c = Costs(AdaptiveParams())
    c.observe(7, 0, 0.037, 0.0, 0.038)  # eight plain rows: 37 ms
    c.draft_step_s = 0.003
    one_row = 0.037 / (1 + 0.4 * 7)
    assert c.verify(9) == pytest.approx(0.037 + 0.4 * one_row)
    assert sum(choose_depths([[1.0] * 3] * 8, [3] * 8, c)) > 0


def test_a_shared_step_s_cost_is_split_into_its_per_step_and_per_sequence_parts():
    from engine.speculative.adaptive.batch import SharedSteps

    fit = SharedSteps()
    assert fit.split(0.004) == (0.004, 0.0)  # nothing timed: all of it per step, the hopeful side
    for steps, rows in [(3, 24), (1, 1), (3, 12), (2, 16), (1, 3)] * 4:
        fit.observe(steps, rows, steps * 0.002 + rows * 0.001)
    assert fit.split(0.004) == pytest.approx((0.002, 0.001))
    probes_only = SharedSteps()
    for _ in range(5):
        probes_only.observe(1, 1, 0.003)  # one sequence alone each time: the parts cannot be told apart
    assert probes_only.split(0.004) == pytest.approx((0.003, 0.0))


def test_a_dear_row_in_each_draft_step_keeps_a_batch_from_drafting_where_a_shared_step_would_pay():
    """A real vocabulary on a CPU: each sequence's row in a draft step is an LM head over 151,936 tokens.
    Priced as one step for all, eight sequences would draft; priced per row, they do not (as measured:
    MTP below MTP-off from two clients on, docs/benchmarks.md)."""
    c = costs(per_row=0.3, fixed=1.0, step=0.5)
    q = [[0.9] * 3] * 8
    assert sum(choose_depths(q, [3] * 8, c, draft=(0.5, 0.0))) > 0
    assert choose_depths(q, [3] * 8, c, draft=(0.05, 0.45)) == [0] * 8
    assert choose_depths(q[:1], [3], c, draft=(0.05, 0.45)) == choose_depths(q[:1], [3], c)  # one: the same


def test_catch_up_rows_folded_into_draft_steps_are_told_apart_once_their_count_varies():
    """Lanes resuming after plain steps bring up to 16 waiting rows into their first draft step, drafting
    lanes one to four: the fit prices those rows apart from the sequences' own rows."""
    from engine.speculative.adaptive.batch import SharedSteps

    fit = SharedSteps()
    for steps, rows, catch_up in [(3, 24, 16), (1, 1, 2), (3, 12, 30), (2, 16, 128), (1, 3, 5), (2, 8, 8)] * 4:
        fit.observe(steps, rows, steps * 0.002 + rows * 0.001 + catch_up * 0.0005, catch_up)
    assert fit.parts(0.004) == pytest.approx((0.002, 0.001, 0.0005))
    assert fit.split(0.004) == pytest.approx((0.002, 0.001)) and fit.catch_up_row() == pytest.approx(0.0005)
    never_varied = SharedSteps()  # no catch-up rows timed: none priced, the two parts as before
    for steps, rows in [(3, 24), (1, 1), (3, 12), (2, 16), (1, 3)] * 4:
        never_varied.observe(steps, rows, steps * 0.002 + rows * 0.001)
    assert never_varied.parts(0.004) == pytest.approx((0.002, 0.001, 0.0))


def test_a_resume_s_waiting_rows_are_spread_over_the_stretch_it_is_expected_to_draft():
    from engine.speculative.adaptive.batch import entry_cost

    assert entry_cost(3, 3, 4.0, 0.001) == pytest.approx(0.003)  # drafting on: its rows every round, whole
    assert entry_cost(16, 2, 4.0, 0.001) == pytest.approx(0.001 * (2 + 14 / 4))  # resuming: the pile spread
    assert entry_cost(16, 2, 0.5, 0.001) == pytest.approx(0.016)  # a stretch under one round: all of it now
    assert entry_cost(1, 2, 4.0, 0.001) == pytest.approx(0.001)


def test_lanes_whose_drafting_would_first_decode_a_pile_of_waiting_rows_stay_plain_at_break_even():
    """Eight lanes at break-even (a draft row about as dear as the token it may bring): priced without
    their waiting rows they resume; with them they stay plain, as MTP-off runs. The measured case: eight
    lanes resuming one draft each spent 19.7 ms catching up against a 40 ms plain step."""
    c = costs(per_row=1.0, fixed=1.0, step=0.05)
    q = [[0.97] * 3] * 8
    free = choose_depths(q, [3] * 8, c, draft=(0.05, 0.05))
    assert sum(free) > 0
    assert choose_depths(q, [3] * 8, c, draft=(0.05, 0.05), entry=[2.5] * 8) == [0] * 8
    # an entry is judged against the whole run it buys: one position alone would not pay for it, three do
    sure = [[1.0] * 3]
    cheap = costs(per_row=0.05, fixed=1.0, step=0.05)
    assert choose_depths(sure, [3], cheap, draft=(0.05, 0.0), entry=[2.0]) == [3]
    assert choose_depths(sure, [1], cheap, draft=(0.05, 0.0), entry=[2.0]) == [0]
