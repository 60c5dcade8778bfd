"""How likely each draft position is accepted, counted with forgetting, pooled and per context.

``q_i`` = probability that draft position ``i`` is accepted given that positions
``0..i-1`` were. Each new observation of a position multiplies its old counts
by ``decay``, so ``q_i`` follows the recent text. A position not seen lately
leans on the one before it (a Beta prior centred there), and a position beyond
a round's drafts fades back to that prior (``idle_decay``), so a depth judged
on bad luck is tried again; plain steps leave the counts alone (the probes
re-try position 0).

Acceptance comes in stretches (quoted code is easy for a while, reasoning hard
for a while), so the counts are also kept per context — whether the last round
that drafted kept every draft (``AFTER_FULL``) or lost one (``AFTER_MISS``) —
with the pooled ``q_i`` as their prior. Where difficulty does not come in
stretches both contexts learn the pooled values; where it does, the first
miss of a hard stretch switches to what hard stretches cost last time.
"""

from __future__ import annotations

from engine.speculative.adaptive.params import AFTER_FULL, AFTER_MISS, FRESH, AdaptiveParams

Counts = tuple[list[float], list[float]]  # decayed rounds that reached position i, and that accepted it


class Acceptance:
    """Per-position acceptance, pooled and per context; ``context`` is the next round's."""

    def __init__(self, n_max: int, params: AdaptiveParams) -> None:
        self.n_max, self.params = n_max, params
        self.pooled_counts: Counts = ([0.0] * n_max, [0.0] * n_max)
        self.by_context: dict[int, Counts] = {c: ([0.0] * n_max, [0.0] * n_max) for c in (AFTER_FULL, AFTER_MISS)}
        self.context = AFTER_FULL

    def pooled(self) -> list[float]:
        """``q_i`` over every round: recent counts plus a prior at the position before."""
        out: list[float] = []
        prior, weight = self.params.prior_first, self.params.prior_weight
        for r, a in zip(*self.pooled_counts, strict=True):
            prior = (a + weight * prior) / (r + weight)
            out.append(prior)
        return out

    def q(self, context: int | None = None) -> list[float]:
        """``q_i`` in ``context`` (default: the next round's): its own counts, the pooled ``q_i`` as prior."""
        context = self.context if context is None else context
        if context == FRESH:
            return self.pooled()
        reached, accepted = self.by_context[context]
        weight = self.params.context_prior_weight
        return [(a + weight * q) / (r + weight) for r, a, q in zip(reached, accepted, self.pooled(), strict=True)]

    def observe(self, n_drafted: int, n_accepted: float) -> None:
        """Count one round, then move to the context it leaves (a plain step says nothing about the text).

        ``n_accepted`` may be a fraction: a sampled shadow draft is counted by the chance rejection
        sampling would have kept it (engine/generation/decoder.py), and leaves a full accept's context
        when that chance is at least one half."""
        counts = [self.pooled_counts]
        if self.context in self.by_context:
            counts.append(self.by_context[self.context])
        p = self.params
        for reached, accepted in counts:
            for i in range(min(int(n_accepted) + 1, n_drafted, self.n_max)):
                reached[i] = p.decay * reached[i] + 1.0
                accepted[i] = p.decay * accepted[i] + min(1.0, max(0.0, n_accepted - i))
            # positions past a draft fade, so a deeper draft is tried again some day
            for i in range(n_drafted if n_drafted else self.n_max, self.n_max):
                reached[i] *= p.idle_decay
                accepted[i] *= p.idle_decay
        if n_drafted:
            self.context = AFTER_FULL if full_accept(n_drafted, n_accepted) else AFTER_MISS


def full_accept(n_drafted: int, n_accepted: float) -> bool:
    """Every draft kept (for a fraction, see :meth:`Acceptance.observe`: likelier kept than not)."""
    return n_accepted >= n_drafted - 0.5
