"""The adaptive-depth policy on synthetic acceptance and costs (no model).

Each test feeds :class:`AdaptiveDepth` the rounds a known world produces —
a true acceptance per position and a true cost per verify size — and checks
that its choice becomes the depth that is best in that world, computed here
by brute force from the world itself.
"""

from __future__ import annotations

import random

import pytest

from engine.speculative import adaptive
from engine.speculative.adaptive import AdaptiveDepth, AdaptiveParams, Costs


class World:
    """True acceptance (conditional, per position) and true costs in seconds."""

    def __init__(self, q: list[float], verify_slope: float, draft_share: float, seed: int = 0) -> None:
        self.q, self.slope, self.draft = q, verify_slope, draft_share
        self.rng = random.Random(seed)
        self.v1 = 0.030

    def verify(self, rows: int) -> float:
        return self.v1 * (1 + self.slope * (rows - 1))

    def rate(self, n: int) -> float:
        expected, reach = 1.0, 1.0
        for i in range(n):
            reach *= self.q[i]
            expected += reach
        return expected / (self.verify(n + 1) + n * self.draft * self.v1)

    def best(self, n_max: int) -> int:
        return max(range(n_max + 1), key=self.rate)

    def play(self, policy: AdaptiveDepth, rounds: int) -> list[int]:
        chosen = []
        for _ in range(rounds):
            n = policy.choose(1000)
            chosen.append(n)
            accepted = 0
            while accepted < n and self.rng.random() < self.q[accepted]:
                accepted += 1
            draft_s = n * self.draft * self.v1
            verify_s = self.verify(n + 1)
            policy.observe(n, accepted, verify_s, draft_s, verify_s + draft_s)
        return chosen


@pytest.mark.parametrize("slope, draft", [(0.1, 0.05), (0.4, 0.2), (0.3, 0.1)])
def test_everything_accepted_converges_to_the_best_depth_of_that_world(slope, draft):
    world = World([1.0] * 8, slope, draft)
    policy = AdaptiveDepth(8)
    chosen = world.play(policy, 60)
    assert world.best(8) >= 2  # a world where depth pays
    assert chosen[-20:] == [world.best(8)] * 20, chosen


def test_nothing_accepted_converges_to_plain_steps_with_rarer_and_rarer_probes():
    world = World([0.0] * 8, 0.4, 0.2)
    policy = AdaptiveDepth(8)
    chosen = world.play(policy, 400)
    assert world.best(8) == 0
    tail = chosen[100:]
    probes = [i for i, n in enumerate(tail) if n]
    assert all(tail[i] == 1 for i in probes)  # a probe drafts one token, no more
    assert len(probes) <= len(tail) // AdaptiveParams().probe_max + 1
    assert policy.probes.every == AdaptiveParams().probe_max


def test_partial_acceptance_finds_the_interior_optimum():
    # q falls with position: the best depth is neither 0 nor the deepest
    world = World([0.9, 0.8, 0.6, 0.4, 0.3, 0.2, 0.1, 0.1], 0.4, 0.2, seed=3)
    best = world.best(8)
    assert 0 < best < 8
    chosen = world.play(AdaptiveDepth(8), 400)
    tail = chosen[200:]
    # acceptance is drawn at random: the choice may sit next to the optimum (whose neighbours are
    # almost as fast here), but the rate it reaches is within a few percent of the best fixed depth
    assert abs(max(set(tail), key=tail.count) - best) <= 1, tail
    assert sum(world.rate(n) for n in tail) / len(tail) >= 0.97 * world.rate(best)


def test_a_change_of_regime_is_followed_both_ways():
    easy, hard = World([1.0] * 8, 0.2, 0.1), World([0.0] * 8, 0.2, 0.1)
    policy = AdaptiveDepth(8)
    easy.play(policy, 40)
    deep = policy.depth
    assert deep == easy.best(8) >= 3
    hard.play(policy, 30)
    assert policy.depth == 0 or policy.probes.probing
    # back to easy text: found again by a probe, then deep within a few rounds
    chosen = easy.play(policy, 60)
    assert chosen[-5:] == [deep] * 5, chosen


def test_room_caps_the_depth():
    policy = AdaptiveDepth(8)
    World([1.0] * 8, 0.1, 0.05).play(policy, 30)
    assert policy.choose(2) == 2
    assert policy.choose(0) == 0


def test_verify_cost_never_falls_with_more_rows():
    policy = AdaptiveDepth(8)
    # noisy timings: 3 rows measured cheaper than 2
    policy.observe(1, 1, 0.020, 0.002, 0.023)
    policy.observe(2, 2, 0.015, 0.004, 0.020)
    costs = [policy.costs.verify(k) for k in range(1, 10)]
    assert costs == sorted(costs)
    # the slow sample is capped by the larger batch timed cheaper, not the other way round
    assert policy.costs.verify(2) == pytest.approx(0.015)


def test_one_slow_sample_does_not_rule_deeper_drafts_out():
    # a CPU mixture-of-experts model: the second row doubles the experts read, later rows add less
    true = {1: 6.0, 2: 14.0, 3: 15.5, 4: 17.5, 5: 19.5, 6: 22.0, 7: 26.0, 8: 28.0, 9: 30.0}
    policy = AdaptiveDepth(8)
    policy.observe(0, 0, true[1] / 1000, 0.0, true[1] / 1000)
    policy.observe(1, 1, true[2] / 1000, 0.001, true[2] / 1000 + 0.001)
    policy.observe(2, 2, 2 * true[3] / 1000, 0.002, 2 * true[3] / 1000 + 0.002)  # preempted: twice its cost
    # past what was timed, a row adds no more than the prior's share of a one-row verify
    assert policy.costs.verify(9) <= (true[3] * 2 + 6 * 0.4 * true[1]) / 1000
    # with every draft accepted, drafting deep still looks worth trying
    for _ in range(10):
        policy.observe(2, 2, true[3] / 1000, 0.002, true[3] / 1000 + 0.002)
    assert policy.best(8) == 8


def test_without_timings_the_prior_tries_drafting():
    # before anything is measured the policy must draft, or it never learns
    assert AdaptiveDepth(4).choose(100) >= 1


def test_the_live_panel_says_the_current_depth_under_adaptive_depth():
    from engine.speculative import stats_text
    from engine.speculative.settings import mtp
    from engine.speculative.stats import StatsSnapshot

    live = StatsSnapshot(settings=mtp(8, depth="adaptive"), rounds=3, drafted=6, accepted=5, draft_depth=2)
    assert stats_text.panel_lines(live)[0].startswith("draft depth 2 now (adaptive, up to 8)")
    fixed = StatsSnapshot(settings=mtp(3), rounds=3, drafted=9, accepted=5, draft_depth=3)
    assert stats_text.panel_lines(fixed)[0].startswith("draft depth 3,")


class StretchWorld:
    """Text whose difficulty comes in stretches: ``run`` tokens all easy (every draft of them
    accepted) with probability ``agree``, else all hard (none) — quoted code, then reasoning."""

    def __init__(self, run: int, agree: float, verify_slope: float, draft_share: float, n_tokens: int = 6000,
                 seed: int = 1) -> None:
        rng = random.Random(seed)
        self.easy: list[bool] = []
        while len(self.easy) < n_tokens:
            self.easy += [rng.random() < agree] * run
        self.slope, self.draft = verify_slope, draft_share

    def play(self, choose) -> float:  # choose(policy_feedback) -> depth; returns tokens per unit time
        pos, spent = 0, 0.0
        while pos < len(self.easy) - 10:
            n = choose.choose(1000)
            accepted = 0
            while accepted < n and self.easy[pos + 1 + accepted]:
                accepted += 1
            verify_s, draft_s = 1 + self.slope * n, n * self.draft
            choose.observe(n, accepted, verify_s, draft_s, verify_s + draft_s)
            spent += verify_s + draft_s
            pos += accepted + 1
        return pos / spent


class Fixed:
    def __init__(self, n: int) -> None:
        self.n = n

    def choose(self, room: int) -> int:
        return self.n

    def observe(self, *args: object) -> None:
        pass


@pytest.mark.parametrize("slope, draft, run, agree", [
    (0.5, 0.17, 32, 0.6),  # this CPU: a verify row costs half a decode; only long easy stretches pay
    (0.1, 0.1, 32, 0.6),  # cheap verify rows (a GPU)
    (0.1, 0.1, 16, 0.5),
])
def test_text_in_easy_and_hard_stretches_beats_every_fixed_depth(slope, draft, run, agree):
    world = StretchWorld(run, agree, slope, draft)
    best_fixed = max(world.play(Fixed(n)) for n in range(9))
    adaptive_rate = world.play(AdaptiveDepth(8))
    # the contexts (after a full accept / after a miss) switch at the first miss of a hard stretch
    # and probe for the next easy one; without them (pooled counts only) this is 1.00x, 1.02x and 0.96x
    assert adaptive_rate >= 1.08 * best_fixed, (adaptive_rate, best_fixed)


def test_acceptance_is_learned_per_context():
    policy = AdaptiveDepth(8)
    StretchWorld(32, 0.6, 0.1, 0.1, n_tokens=3000).play(policy)
    after_full, after_miss = policy.acceptance.q(adaptive.AFTER_FULL), policy.acceptance.q(adaptive.AFTER_MISS)
    assert after_full[0] > 0.8 and after_miss[0] < 0.5, (after_full, after_miss)


def test_a_shadow_probe_is_cheaper_so_it_probes_more_often():
    # a CPU where a second verify row costs more than a whole decode (MoE) and a draft step little
    def searching(shadow: bool) -> AdaptiveDepth:
        policy = AdaptiveDepth(8, costs=Costs.given({1: 1.0, 2: 2.2, 9: 5.0}, draft_step_s=0.15))
        policy.shadow = shadow
        for _ in range(20):  # easy stretches pay: full accepts at depth 8 ...
            policy.observe(8, 8, 5.0, 1.2, 6.2)
        policy.observe(8, 0, 5.0, 1.2, 6.2)  # ... then a miss: searching for the next one
        return policy

    verified, shadow = searching(False), searching(True)
    assert verified.acceptance.context == shadow.acceptance.context == adaptive.AFTER_MISS
    assert 2 <= shadow.probe_gap(8) < verified.probe_gap(8) <= AdaptiveParams().probe_max


def test_a_shadow_probe_teaches_acceptance_like_a_verified_one_and_times_a_plain_step():
    policy = AdaptiveDepth(4)
    policy.shadow = True
    policy.observe(2, 0, 0.020, 0.002, 0.023)  # a miss: searching
    policy.observe(1, 1, 0.010, 0.001, 0.012, shadow=True)  # the plain step's token was the draft
    assert policy.acceptance.context == adaptive.AFTER_FULL and policy.probes.stretches_found == 1.0
    assert set(policy.costs.verify_s) == {1, 3}  # the probe's verify had one row, and is timed as one


@pytest.mark.parametrize("shadow", [False, True])
@pytest.mark.parametrize("slow_rows", [2, 4])
def test_one_slow_first_timing_does_not_stop_drafting_for_good(shadow, slow_rows):
    # every draft would be accepted; verify rows cost 0.005 s each after the first (0.010 s)
    def verify(rows: int) -> float:
        return 0.010 + 0.005 * (rows - 1)

    policy = AdaptiveDepth(8)
    policy.shadow = shadow
    for rows in range(1, slow_rows):  # the sizes below are timed well ...
        policy.observe(rows - 1, rows - 1, verify(rows), 0.001 * (rows - 1), verify(rows) + 0.001 * (rows - 1))
    # ... the first verify of slow_rows rows is preempted: 10x its cost
    policy.observe(slow_rows - 1, slow_rows - 1, 10 * verify(slow_rows), 0.001, 10 * verify(slow_rows))
    depths = []
    for _ in range(300):
        n = policy.choose(1000)
        depths.append(n)
        if policy.shadow_probe:  # a shadow probe: a plain step whose token was the draft
            policy.observe(1, 1, verify(1), 0.001, verify(1) + 0.001, shadow=True)
            continue
        policy.observe(n, n, verify(n + 1), 0.001 * n, verify(n + 1) + 0.001 * n)
    assert depths[-20:] == [8] * 20, depths


def test_the_plain_step_time_leaves_out_rounds_whose_draft_the_drafter_declined():
    policy = AdaptiveDepth(4)
    policy.depth, policy.probes.probing = 0, False
    policy.observe(0, 0, 0.010, 0.0, 0.010)  # plain steps
    policy.observe(0, 0, 0.010, 0.0, 0.010)
    policy.depth = 2
    policy.observe(0, 0, 0.010, 0.004, 0.030)  # asked for 2 drafts, the drafter gave none (it still decoded)
    assert policy.costs.plain_round_s == pytest.approx(0.010)


def test_a_new_reply_starts_from_the_pooled_counts_not_the_last_replys_end():
    policy = AdaptiveDepth(8, costs=Costs.given({k: 1.0 + 0.1 * (k - 1) for k in range(1, 10)}, draft_step_s=0.1))
    StretchWorld(32, 0.8, 0.1, 0.1, n_tokens=3000).play(policy)
    policy.observe(8, 0, 1.8, 0.8, 2.6)  # the reply ends at a miss: a hard stretch was starting
    assert policy.best(8) == 0  # within that reply: plain steps until a probe finds easy text
    policy.new_reply()
    assert policy.acceptance.context == adaptive.FRESH and policy.best(8) >= 4  # mostly easy text: draft


def test_tunable_numbers_are_one_checked_value():
    with pytest.raises(ValueError, match="decay"):
        AdaptiveParams(decay=1.5)
    with pytest.raises(ValueError, match="probe_first"):
        AdaptiveParams(probe_first=100, probe_max=64)
    # an A/B of the policy is a second value, not a patched constant: a slower memory keeps
    # drafting deep for longer after easy text turns hard
    easy, hard = World([1.0] * 8, 0.2, 0.1), World([0.0] * 8, 0.2, 0.1, seed=3)
    quick, slow = AdaptiveDepth(8), AdaptiveDepth(8, AdaptiveParams(decay=0.99))
    for policy in (quick, slow):
        easy.play(policy, 40)
        hard.play(policy, 3)
    assert slow.acceptance.q(adaptive.FRESH)[0] > quick.acceptance.q(adaptive.FRESH)[0]


def test_a_fractional_shadow_hit_counts_as_that_share_of_an_accepted_draft():
    from engine.speculative.adaptive.acceptance import Acceptance
    from engine.speculative.adaptive.params import AFTER_FULL, AFTER_MISS

    whole, shares = Acceptance(3, AdaptiveParams()), Acceptance(3, AdaptiveParams())
    for hit in (1, 0, 0, 0):
        whole.observe(1, hit)
    for _ in range(4):
        shares.observe(1, 0.25)  # four rounds, each a quarter likely to be kept
    reached, accepted = shares.pooled_counts
    assert reached == whole.pooled_counts[0]  # four rounds reached position 0 either way
    assert accepted[0] == pytest.approx(0.25 * reached[0]) and accepted[1:] == [0.0, 0.0]
    assert shares.context == AFTER_MISS
    shares.observe(1, 0.75)
    assert shares.context == AFTER_FULL


def test_short_replies_after_an_unlucky_miss_still_find_drafting():
    """A server's short completions: one miss (its warm-up request), then text whose every draft is kept.
    Each reply starts its probes afresh and a probe that hits is followed soon by another, so drafting
    starts within a few replies. Before, the wait between probes doubled past a reply's length, the
    plain-step count restarted with each reply, and no probe ever came again."""
    world = World([1.0] * 3, verify_slope=0.6, draft_share=0.2)  # a CPU MoE model: depth pays
    assert world.best(3) == 3
    policy = AdaptiveDepth(3)
    policy.observe(1, 0, world.verify(2), world.draft * world.v1, world.verify(2) + world.draft * world.v1)
    depths: list[list[int]] = []
    for _ in range(6):
        policy.new_reply(shadow_probes=True)
        tokens, chosen = 0, []
        while tokens < 32:
            n = policy.choose(32 - tokens)
            draft_s = max(n, 1) * world.draft * world.v1 if n else 0.0
            if policy.shadow_probe:  # drafted, not verified: the plain step's token was the draft
                policy.observe(1, 1, world.verify(1), draft_s, world.verify(1) + draft_s, shadow=True)
                tokens += 1
                continue
            policy.observe(n, n, world.verify(n + 1), draft_s, world.verify(n + 1) + draft_s)
            chosen.append(n)
            tokens += n + 1
        depths.append(chosen)
    assert any(depths[1]) or any(depths[2]), depths  # drafting found within the first replies
    assert depths[-1] and all(n >= 1 for n in depths[-1]), depths


def test_a_batch_that_would_not_draft_with_every_draft_kept_stops_its_sequences_probing():
    # engine/generation/parallel.py asks the batch's choice with every q at 1: where even that is no
    # drafting, no sequence probes (at a real vocabulary each probe is a draft step's LM-head row)
    policy = AdaptiveDepth(4)
    assert [policy.take(0, 4, probe=False) for _ in range(200)] == [0] * 200
    assert policy.take(0, 4) == 1 and policy.probes.probing  # allowed again: long due, it probes at once


def test_hits_do_not_bring_probes_soon_where_drafting_at_that_acceptance_would_not_pay():
    """A real vocabulary's head on a CPU: every draft kept would pay a little, but at the 80 % the probes
    find it does not (a draft step costs half a plain step). A hit used to bring the next probe two steps
    later whatever drafting would gain, so such a policy probed every few steps for good (each probe an
    LM-head row). Now, where drafting at the acceptance after a hit still would not pay, probes back off."""
    world = World([0.8] * 3, verify_slope=0.4, draft_share=0.5)
    assert world.best(3) == 0 and (1 + 1) / (world.verify(2) + world.draft * world.v1) > 1 / world.verify(1)
    policy = AdaptiveDepth(3)
    hits = iter([1, 1, 1, 1, 0] * 1000)
    probes = []
    for _ in range(8):
        policy.new_reply(shadow_probes=True)
        count = 0
        for _ in range(32):
            n = policy.choose(32)
            draft_s = world.draft * world.v1 if n else 0.0
            if policy.shadow_probe:
                count += 1
                policy.observe(1, next(hits), world.verify(1), draft_s, world.verify(1) + draft_s, shadow=True)
            else:
                policy.observe(n, n * 0.8, world.verify(n + 1), draft_s * n, world.verify(n + 1) + draft_s * n)
        probes.append(count)
    assert sum(probes[-4:]) <= 8, probes  # about one probe per reply once it has learned, not one in three steps


def test_a_pair_of_sizes_timed_the_wrong_way_round_does_not_make_every_later_row_free():
    """A batch of 8 sequences (bench MoE, one thread) timed these verify sizes, each a noisy average: 10 rows
    came out dearer than 11. Taking the smallest slope between neighbours priced every row past 15 at
    nothing (verify(32) = verify(15)), and the batch drafted at break-even; a line through the larger sizes
    prices them as they go on."""
    from engine.speculative.adaptive.costs import Costs

    ms = {2: 17.6, 3: 19.8, 4: 22.9, 5: 25.1, 6: 28.3, 7: 33.7, 8: 35.6, 9: 42.0, 10: 51.3, 11: 49.0, 15: 54.5}
    c = Costs.given({k: t / 1000 for k, t in ms.items()}, draft_step_s=0.002)
    assert c.verify(32) > 1.5 * c.verify(15)
    assert c.verify(20) < c.verify(24) < c.verify(32)


def test_a_cold_two_row_verify_timed_once_does_not_keep_shadow_probes_from_ever_leading_to_drafts():
    """Through the server, after its warm-up request: the first one-row steps ran cold (graphs built), a
    lone probe's two-row verify was timed once at 2.6x what one row then settled at, capped only against
    those cold one-row timings, and its draft rejected. Shadow probes (plain steps) then found every draft
    kept, but they time no verify of two rows: that one cold sample stood, drafting at any depth looked
    slower than plain steps even with every draft kept, and six replies that a fixed depth drafted fully
    had no draft. A young size is read no dearer than the established ones predict, so drafting is tried,
    and then judged on its warm timings (here drafting at depth 3 is close to break-even, and whether it
    is taken rests on acceptance deeper than probes see; in the server's run it was, every round)."""
    # this machine's bench-size mixture of experts, warm: the second row doubles the experts read
    warm = {1: 0.0063, 2: 0.0146, 3: 0.0181, 4: 0.0202}
    draft = 0.00135
    policy = AdaptiveDepth(3)
    policy.new_reply(shadow_probes=True)
    policy.observe(0, 0, 0.030, 0.0, 0.030)  # cold one-row steps
    policy.observe(0, 0, 0.012, 0.0, 0.012)
    policy.observe(1, 0, 0.0164, draft, 0.0164 + draft)  # the probe: cold, and its draft rejected
    for _ in range(200):  # then one-row steps settle
        policy.observe(0, 0, warm[1], 0.0, warm[1])
    drafted = []
    for _ in range(300):  # every draft kept from now on
        n = policy.choose(1000)
        if policy.shadow_probe:  # a plain step whose token was the draft
            policy.observe(1, 1, warm[1], draft, warm[1] + draft, shadow=True)
            continue
        drafted.append(n)
        policy.observe(n, n, warm[n + 1], draft * n, warm[n + 1] + draft * n)
    assert any(drafted), drafted  # drafting tried again ...
    c = policy.costs
    assert c.verify_n[2] >= policy.params.clip_after  # ... its two-row verify timed again, now established
    assert c.verify(2) == pytest.approx(warm[2], rel=0.1)  # at what it costs warm


def test_a_plain_step_is_priced_as_timed_not_as_one_verify_row_plus_a_drafting_rounds_overhead():
    policy = AdaptiveDepth(4)
    policy.depth = 3
    for _ in range(4):  # drafting rounds: 4 rows verified, 3 draft steps, 6 ms of the head's catch-up and sampling
        policy.observe(3, 3, 0.037, 0.003, 0.046)
    modelled = policy.costs.round(0)
    policy.depth = 0
    policy.observe(0, 0, 0.010, 0.0, 0.0105)  # plain steps by choice pay none of that (the first one after
    policy.observe(0, 0, 0.010, 0.0, 0.0105)  # drafting is not timed: see the test below)
    assert modelled > 0.02
    assert policy.costs.round(0) == pytest.approx(0.0105)


def test_a_policy_that_always_drafted_times_a_plain_step_and_stops_drafting_where_that_is_faster():
    """Every draft kept, but a verify row costs 0.9 of the first (a CPU), and a drafting round pays 6 ms a plain
    step does not: plain decoding is the fastest (100 tokens/s; depth 8 93.8). Never stepping plainly, the
    policy priced a plain step from the drafting sizes plus their overhead, far above its cost, and drafted for good;
    measured at last (the bench-size glm4moe, one client, 32-token replies) adaptive depth ran at 0.95x not
    drafting."""
    def verify(rows: int) -> float:
        return 0.010 * (1 + 0.9 * (rows - 1))

    policy = AdaptiveDepth(8)
    depths = []
    for _ in range(400):
        n = policy.choose(1000)
        depths.append(n)
        if policy.shadow_probe:
            policy.observe(1, 1, verify(1), 0.001, verify(1) + 0.001, shadow=True)
        elif n:
            policy.observe(n, n, verify(n + 1), 0.001 * n, verify(n + 1) + 0.001 * n + 0.006)
        else:
            policy.observe(0, 0, verify(1), 0.0, verify(1))
    assert 0 not in depths[:30]  # the prior drafts, and the drafting sizes timed keep it drafting
    assert depths[-100:].count(0) >= 80, depths[-100:]


def test_plain_decoding_is_priced_by_plain_steps_after_plain_steps_not_the_first_after_drafting():
    """A plain step right after a drafting round costs more than plain decoding does (its graph is built again
    after the verify's, the head's decodes went through the caches): on the bench-size glm4moe, one client,
    6.8 ms against 6.3. Drafting here is slower than plain decoding (at most 97.8 tokens/s, plain 100) but
    faster than plain steps priced at what the first after drafting costs (76.9): timing those, the policy
    drafted for good (0.96x the speed of not drafting). Now it times a plain step only after a plain step
    (two in a row when it checks), and settles on plain steps."""
    def verify(rows: int) -> float:
        return 0.010 * (1 + 0.9 * (rows - 1))

    cold = 0.003  # what a plain step after a round that ran the head adds
    policy = AdaptiveDepth(8)
    depths, head_ran = [], False
    for _ in range(600):
        n = policy.choose(1000)
        depths.append(n)
        plain = verify(1) + (cold if head_ran else 0.0)
        if policy.shadow_probe:
            policy.observe(1, 1, plain, 0.001, plain + 0.001, shadow=True)
        elif n:
            policy.observe(n, n, verify(n + 1), 0.001 * n, verify(n + 1) + 0.001 * n + 0.002)
        else:
            policy.observe(0, 0, plain, 0.0, plain)
        head_ran = n > 0
    assert policy.costs.plain_round_s == pytest.approx(verify(1), rel=0.05)
    assert depths[-100:].count(0) >= 80, depths[-100:]
