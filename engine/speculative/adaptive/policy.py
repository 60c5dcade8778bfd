"""Adaptive depth: each round drafts the length with the most expected tokens per second.

Expected tokens from a round of ``n`` drafts: ``E(n) = 1 + sum_{i<n} prod_{j<=i} q_j``
(acceptance.py; the target's own token always counts); its cost ``T(n)``
(costs.py). The round drafts ``argmax_n E(n) / T(n)``; the drafter's ``p_min``
still stops a draft early at an unsure token. When the answer is 0 the policy
probes with one draft token now and then (probes.py).

It never changes output: every draft is verified, and the depth only decides
how many rows a verify batch has. Which rounds draft depends on timings; the
emitted tokens do not (greedy), and each sampled token is still the target's.
"""

from __future__ import annotations

from engine.speculative.adaptive.acceptance import Acceptance
from engine.speculative.adaptive.costs import Costs
from engine.speculative.adaptive.params import AFTER_FULL, AFTER_MISS, FRESH, AdaptiveParams
from engine.speculative.adaptive.probes import Probes

PLAIN_CHECK_STEPS = 2  # plain steps a check takes: the second is timed (AdaptiveDepth.observe)


class AdaptiveDepth:
    """A :class:`~engine.speculative.depth.DepthPolicy` that learns acceptance and costs as it goes.

    Args:
        n_max: the deepest draft it may choose (already limited to what the model drafts).
        params: its tunable numbers.
        costs: costs to start from (``Costs(params, ..., timed=False)``: given, never timed).
    """

    def __init__(self, n_max: int, params: AdaptiveParams | None = None, costs: Costs | None = None) -> None:
        self.n_max = n_max
        self.params = params or AdaptiveParams()
        self.acceptance = Acceptance(n_max, self.params)
        self.costs = costs or Costs(self.params)
        self.probes = Probes(self.params)
        self.depth = 0  # the last choice
        self.drafted_in_a_row = 0  # drafting rounds since the last plain step (see AdaptiveParams.plain_check)
        self.plain_checks = 0  # times plain steps were taken to time one
        self.checking = 0  # plain steps still to take for the current check
        self.after_plain = False  # the last round was a plain step: the next one times what plain decoding costs
        # a probe is a shadow probe — drafted, not verified; the plain step's own token tells
        # whether the draft would have been accepted (when the drafter allows it)
        self.shadow = False

    @property
    def shadow_probe(self) -> bool:
        """The round just chosen is a shadow probe: draft, but do not verify."""
        return self.probes.probing and self.shadow

    def rates(self, cap: int, context: int | None = None) -> list[float]:
        """Expected tokens per second of a round of each depth ``0..cap`` in ``context``."""
        q = self.acceptance.q(context)
        out, expected, reach = [], 1.0, 1.0
        for n in range(cap + 1):
            if n:
                reach *= q[n - 1]
                expected += reach
            out.append(expected / self.costs.round(n))
        return out

    def best(self, cap: int, context: int | None = None) -> int:
        """The depth in ``0..cap`` with the most expected tokens per second (ties: the shallower)."""
        rates = self.rates(cap, context)
        return rates.index(max(rates))

    def could_pay(self, cap: int) -> bool:
        """Would drafting pay at some depth up to ``cap`` if every draft were accepted? When not (a draft
        step dearer than what a kept token saves, as a real vocabulary's head on a small trunk is),
        learning acceptance cannot change the choice, and probes may stay rare."""
        plain = 1.0 / self.costs.round(0)
        return any((1 + n) / self.costs.round(n) > plain for n in range(1, cap + 1))

    def _pays_after_hit(self, cap: int) -> bool:
        """Would drafting pay at the acceptance counted after rounds that kept every draft (an easy stretch)?"""
        full = self.rates(cap, AFTER_FULL)
        return max(full) > full[0]

    def probe_gap(self, cap: int) -> int:
        """Plain steps until the next probe (probes.py), chosen as a probe starts, by the context the
        rounds before it left: after a kept draft (the last probe hit) soon again, since each hit moves
        ``q_0`` only part of the way to drafting (unless drafting at that acceptance would not pay: then backing
        off); searching after a miss by the hazard of easy stretches;
        at a reply's start after ``probe_first``. Backing off where nothing can be found."""
        if cap < 1 or not self.could_pay(cap):
            return self.probes.backed_off()
        context = self.acceptance.context
        if context == AFTER_FULL:
            # soon again only where drafting at the acceptance after a hit would pay: where it would not
            # (a real vocabulary's head on a CPU, kept 80 % of the time), hits came every few steps and each
            # brought another probe two steps later, for good
            return self.probes.after_hit() if self._pays_after_hit(cap) else self.probes.backed_off()
        if context != AFTER_MISS:
            return self.params.probe_first
        if not self._pays_after_hit(cap):
            return self.probes.backed_off()
        full = self.rates(cap, AFTER_FULL)
        return self.probes.gap(1.0 - full[0] / max(full), self.costs.probe_cost(self.shadow))

    # -- the loop's calls ---------------------------------------------------
    def new_reply(self, shadow_probes: bool = False) -> None:
        """A generation starts: its first rounds use the pooled counts (a reply that ended in a hard
        stretch says little about how the next starts), and a plain-step streak does not carry over.
        Its first probe comes after ``probe_first`` plain steps however far the last reply backed off
        (otherwise, once the wait outgrew the replies, a server's 32-token completions, no reply ever
        probed again and adaptive depth stayed plain for good after one unlucky miss), unless drafting
        would not pay even at the acceptance of an easy stretch: then the wait keeps growing."""
        self.shadow = shadow_probes and self.params.shadow_probes
        self.acceptance.context = FRESH
        self.probes.plain_steps = 0
        self.probes.probing = False
        self.after_plain = False  # (the prompt's decode came before)
        if self.could_pay(self.n_max) and self._pays_after_hit(self.n_max):
            self.probes.every = min(self.probes.every, self.params.probe_first)

    def choose(self, room: int) -> int:
        """This round's draft length, at most ``room`` (what is left of the reply and context)."""
        cap = max(0, min(self.n_max, room))
        probes = self.probes
        if self.depth == 0 and not probes.probing and probes.plain_steps % self.params.recheck_plain:
            n = 0  # plain steps: acceptance is unchanged, only timings drift; look again every few
        else:
            n = self.best(cap) if cap else 0
        if n and (self.checking or self._time_a_plain_step()):
            if not self.checking:
                self.checking = PLAIN_CHECK_STEPS
                self.plain_checks += 1
            self.checking -= 1
            self.drafted_in_a_row, self.depth, probes.probing = 0, 0, False
            return 0
        return self.take(n, cap)

    def _time_a_plain_step(self) -> bool:
        """Take plain steps now, to time one? After ``plain_check`` drafting rounds in a row while fewer
        than three were timed so, then eight times as rarely: what drafting is weighed against is then
        measured, at a cost of two rounds in ~250 where drafting pays (a GPU). Two, because only a plain step
        after a plain step is timed (see :meth:`observe`)."""
        check = self.params.plain_check
        if not check or not self.costs.timed:
            return False
        return self.drafted_in_a_row >= (check if self.plain_checks < 3 else 8 * check)

    def take(self, n: int, cap: int, probe: bool = True) -> int:
        """Make ``n`` (at most ``cap``) this round's draft length, probing instead of a plain step when
        the schedule says so (and ``probe``: a batch that would not draft even if every draft were kept
        says no). :meth:`choose` decides ``n`` alone; a batch of sequences decides it for all
        (adaptive/batch.py)."""
        n = min(n, cap)
        probes = self.probes
        probes.probing = False
        self.drafted_in_a_row = self.drafted_in_a_row + 1 if n else 0
        if n == 0 and cap:
            if probes.plain_step() and probe:
                probes.start_probe(self.probe_gap(cap))
                n = 1
        elif n:
            probes.drafting()
        self.depth = n
        return n

    def observe(self, n_drafted: int, n_accepted: float, verify_s: float, draft_s: float, round_s: float,
                shadow: bool = False) -> None:
        """What one round measured: drafts proposed and accepted, and where its time went.

        ``shadow``: the round was a plain step with a shadow probe — ``n_drafted`` drafts
        not verified, ``n_accepted`` of them equal to what the target produced (a sampled draft: the
        chance rejection sampling would have kept it).
        """
        costs = self.costs
        # a plain step by choice (a draft the drafter declined costs its decode)
        plain = not self.depth and not self.probes.probing
        if costs.timed:
            costs.observe(0 if shadow else n_drafted, n_drafted, verify_s, draft_s, round_s)
            if self.probes.probing:
                costs.probe_round_s = costs.average(costs.probe_round_s, round_s)
            elif plain and self.after_plain:
                # what staying plain costs is timed on a plain step after a plain step: the first after a round
                # that ran the head pays for that round too (its graph built again after the verify's, the
                # head's decodes through the caches): one-row decodes took 6.84 ms there against 6.59 later in
                # the same run on the bench-size glm4moe, 6.2-6.5 in a run that never drafted
                costs.plain_round_s = costs.average(costs.plain_round_s, round_s)
        self.after_plain = plain and not n_drafted
        searching = self.acceptance.context == AFTER_MISS
        self.acceptance.observe(n_drafted, n_accepted)
        if searching:
            self.probes.searched(n_drafted, n_accepted)
