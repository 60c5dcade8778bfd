"""When to draft one token although drafting does not pay now: so an easy stretch is found again.

After a miss, when easy stretches pay (drafting after a full accept is faster
than plain steps): probing every ``m`` plain steps costs ``c / m`` per step
(``c``: what a probe adds to a plain step, in plain steps) and finds a new easy
stretch ``m / 2`` tokens late on average, each token losing ``g`` (the share of
a plain step drafting saves there); with easy stretches starting at a rate
``h`` per plain step that is ``c / m + h * g * m / 2``, least at
``m = sqrt(2 c / (h g))``. ``h`` is counted (stretches found per plain step
searched). After a probe whose draft was kept the next comes soon (one hit
moves acceptance only part of the way to drafting); where even drafts always
kept would not pay, probes back off, doubling up to ``probe_max``, as they do
after misses where easy stretches do not pay.
"""

from __future__ import annotations

from engine.speculative.adaptive.acceptance import full_accept
from engine.speculative.adaptive.params import AdaptiveParams


class Probes:
    """The probe schedule and the hazard of easy stretches it searches for."""

    def __init__(self, params: AdaptiveParams) -> None:
        self.params = params
        self.every = params.probe_first  # plain steps between probes, now
        self.plain_steps = 0  # plain steps since the last probe or drafting round
        self.probing = False  # the current round is a probe
        self.steps_searched = 0.0  # decayed plain steps after a miss
        self.stretches_found = 0.0  # decayed drafting rounds after a miss that kept every draft

    def backed_off(self) -> int:
        return min(self.params.probe_max, 2 * self.every)

    def after_hit(self) -> int:
        """The wait after a probe whose draft was kept: a quarter of ``probe_first`` (at least 2)."""
        return max(2, self.params.probe_first // 4)

    def gap(self, gain: float, cost: float) -> int:
        """Plain steps until the next probe, while searching: ``gain`` is the share of a plain step
        an easy stretch saves per token, ``cost`` what a probe adds, in plain steps."""
        p = self.params
        hazard = (self.stretches_found + p.hazard_prior * p.hazard_prior_steps) / (self.steps_searched
                                                                                   + p.hazard_prior_steps)
        return int(min(p.probe_max, max(2.0, (2.0 * cost / (hazard * gain)) ** 0.5)))

    def plain_step(self) -> bool:
        """Count a plain step; True when it is time to probe (then :meth:`start_probe`)."""
        self.plain_steps += 1
        return self.plain_steps >= self.every

    def start_probe(self, gap: int) -> None:
        self.plain_steps, self.every, self.probing = 0, gap, True

    def drafting(self) -> None:
        """A round drafts by choice: the schedule starts over."""
        self.plain_steps, self.every = 0, self.params.probe_first

    def searched(self, n_drafted: int, n_accepted: float) -> None:
        """One round after a miss: a plain step or a probe is a step of the search; a round
        that kept every draft found a stretch."""
        p = self.params
        if not n_drafted or self.probing:
            self.steps_searched = p.hazard_decay * self.steps_searched + 1.0
            self.stretches_found *= p.hazard_decay
        if n_drafted and full_accept(n_drafted, n_accepted):
            self.stretches_found += 1.0
