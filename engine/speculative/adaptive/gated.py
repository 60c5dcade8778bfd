"""Adaptive depth for a sequence decoding alone, behind the drafting gate a batch of sequences has.

The policy (policy.py) chooses each round's depth from a model of what a round
costs, timed round by round. What the model does not see still costs: the head's
decodes leave the target's weights colder in the caches, so the plain steps it
times between drafting rounds cost more than plain decoding does, and per-reply
work (the head reading each prompt, catching up as a reply ends) falls outside
every round. On the bench-size glm4moe, one sequence, every draft kept, the
model's plain step was 7.0 ms where plain decoding takes 6.3, depth 3 looked
1.12x as fast as plain steps where it ran 0.96x, and after 30 replies of 64
tokens the policy drafted for good in three sessions of three, at 0.82-0.93x
the speed of not drafting over the next 30.

So, as for a batch (batch_gate.py, band 1), the gate times whole rounds of three
ways — the policy's choices, plain steps, every round as deep as it may — a
stretch of each now and then, and keeps to the fastest. It changes only how many
tokens are drafted, never which are kept.
"""

from __future__ import annotations

from engine.speculative.adaptive.batch_gate import FULL, POLICY, DraftingGate
from engine.speculative.adaptive.policy import AdaptiveDepth


class GatedDepth:
    """A :class:`~engine.speculative.depth.DepthPolicy`: ``policy`` chooses where the gate says so; plain
    steps or full depth where those ran faster lately. Both are kept between requests
    (engine/speculative/choice.py), as a batch keeps its gate."""

    def __init__(self, policy: AdaptiveDepth, gate: DraftingGate | None = None) -> None:
        self.policy = policy
        self.gate = gate or DraftingGate()
        self._chose = False  # the round just chosen drafts by the policy's choice (a probe is not one)

    @property
    def depth(self) -> int:
        return self.policy.depth

    @property
    def shadow_probe(self) -> bool:
        return self.policy.shadow_probe

    def new_reply(self, shadow_probes: bool = False) -> None:
        self.policy.new_reply(shadow_probes)

    def choose(self, room: int) -> int:
        mode = self.gate.mode(1)
        if mode == POLICY:
            n = self.policy.choose(room)
            self._chose = n > 0 and not self.policy.probes.probing
            return n
        cap = max(0, min(self.policy.n_max, room))
        self._chose = False
        return self.policy.take(cap if mode == FULL else 0, cap, probe=False)

    def observe(self, n_drafted: int, n_accepted: float, verify_s: float, draft_s: float, round_s: float,
                shadow: bool = False) -> None:
        self.policy.observe(n_drafted, n_accepted, verify_s, draft_s, round_s, shadow)
        tokens = 1 if shadow else 1 + int(n_accepted)  # the round's own token, and the drafts it kept
        self.gate.observe(1, tokens, round_s, drafted=self._chose)
