"""Adaptive depth for a sequence alone behind the drafting gate (engine/speculative/adaptive/gated.py), on a
synthetic world whose costs the policy's round model cannot see."""

from __future__ import annotations

from engine.speculative.adaptive import AdaptiveDepth
from engine.speculative.adaptive.gated import GatedDepth


class World:
    """Every draft kept; a plain step 10 ms; a verify of n + 1 rows 10 ms plus ``row`` of that per draft; a draft
    step 1 ms; a drafting round 2 ms more; and the first two plain steps after a round that ran the head ``cold``
    more (its decodes went through the caches)."""

    def __init__(self, row: float, cold: float) -> None:
        self.row, self.cold = row, cold
        self.since_head = 99  # plain steps since a round ran the head

    def play(self, policy, rounds: int) -> list[int]:
        depths = []
        for _ in range(rounds):
            n = policy.choose(1000)
            depths.append(n)
            plain = 0.010 + (self.cold if self.since_head < 2 else 0.0)
            if policy.shadow_probe:
                policy.observe(1, 1, plain, 0.001, plain + 0.001, shadow=True)
            elif n:
                verify = 0.010 * (1 + self.row * n)
                policy.observe(n, n, verify, 0.001 * n, verify + 0.001 * n + 0.002)
            else:
                policy.observe(0, 0, plain, 0.0, plain)
            self.since_head = 0 if (n or policy.shadow_probe) else self.since_head + 1
        return depths


def cold_caches() -> World:
    """A verify row costs a plain step, and the first two plain steps after the head ran 3 ms more: plain
    decoding runs 100 tokens/s, drafting at most 90 (depth 8), plain steps as the policy times them after
    drafting 77."""
    return World(row=1.0, cold=0.003)


def test_the_gate_keeps_a_sequence_alone_plain_where_its_policy_drafted_for_good_at_a_loss():
    """The policy alone prices plain steps at what they cost after drafting, and drafts for good at 0.9x the
    speed of plain decoding (on the bench-size glm4moe, one sequence: 0.82-0.93x MTP off in three sessions of
    three). Timing whole stretches, the gate finds plain steps faster and keeps them."""
    alone = cold_caches().play(AdaptiveDepth(8), 1500)
    assert alone[-200:].count(0) < 20  # the failure: drafting for good

    gated = GatedDepth(AdaptiveDepth(8))
    depths = cold_caches().play(gated, 1500)
    assert depths[-200:].count(0) >= 180, depths[-200:]
    mode, rates = gated.gate.summary()[1]
    assert rates["plain"] > rates["policy"]


def test_where_drafting_pays_the_gate_keeps_the_policys_drafting():
    """The same world with verify rows at a tenth of a plain step (a GPU): drafting at depth 8 runs 3.2x plain
    decoding, and the gated policy drafts as the policy alone does, trying plain steps only now and then."""
    gated = GatedDepth(AdaptiveDepth(8))
    depths = World(row=0.1, cold=0.0).play(gated, 1500)
    assert depths[-400:].count(0) <= 16, depths[-400:]  # a plain stretch at most, cut short
    assert gated.gate.mode(1) in ("policy", "full")
