"""Which way of drafting pays in a batch of this many sequences, measured whole.

The batch policy (adaptive/batch.py) chooses depths from a cost model: verify
rows by total batch rows, draft steps by part per step and part per sequence,
a lazy head's waiting rows as an entry cost. What it does not see still costs:
Python around every round of every sequence, rows a resuming head decodes in
ways the fit smooths over, acceptance that is exact per token but not per
chain. At 8 sequences on a CPU those misses cost more than drafting wins
(docs/benchmarks.md: adaptive depth at 0.75-0.84x of MTP off). So the gate
times what the user gets — tokens out per second of whole steps — per number of
sequences, for three ways: the policy's choices, no drafting at all, and every
sequence drafting as deep as it may (what a fixed depth does), and keeps to the
best, trying the others for a stretch of steps now and then so that a change
(a longer context, another text) is seen. A stretch, not a step: a resume's
cost falls on the first drafting steps after plain ones, and a lone step of
each would charge drafting for a resume every time.

The third way is there because the policy's own drafting can lose where a fixed
depth wins: it drafts some sequences and not others, shallower, and a lazy head
resuming after plain steps decodes the rows it skipped (through the server on
the bench-size oracle model, 4 clients: adaptive depth 0.87x of MTP off where
depth 3 ran 1.06-1.12x; docs/benchmarks.md). Stretches at full depth also teach
every sequence's policy its acceptance at every position.

Only steps in which the policy drafted by choice count for it: a step it keeps
plain (with at most a probe) says nothing about its drafting. Counted, the
first stretches at a new batch size were mostly those, while the policy was
still learning acceptance from probes; plain steps then "won" by the noise
between two plain measurements, and the gate kept plain for the next 96 steps,
in which the policy could not learn (in process on the bench-size oracle model,
4 sequences: 4 tokens drafted in 196 steps, where a fixed depth 3 ran 1.1x
faster than MTP off). A stretch of the policy's that never drafted measures
nothing, and the best of the others is kept.

Trying costs: a stretch of a way that loses was paid for in full (at 8 sequences
on a CPU every sequence at full depth ran 0.75x of plain steps; its stretch each
revisit cost ~2.5 % of a run, and adaptive depth ended 0.90-0.94x of MTP off).
So a way tried against one already measured stops after :data:`MIN_TRIAL`
steps where it runs below :data:`CUT` of that one's rate: a clear loss shows in
a few steps (a resume's cost is spread over them), a close one gets its
stretch. And a revisit that confirms the best puts the next one twice as far
off, up to :data:`BACKOFF` times: conditions that held for hundreds of steps
are looked at again less and less often, and a change of best starts over.
What each way measured ages with every stretch, whichever ran: a way looked at
again after hundreds of steps is judged on what it does now, not outvoted by
what it did then.

Batch sizes are judged in bands (1, 2, 3-4, 5-8, 9-16, ...): clients sending
requests back to back keep the number decoding moving by one or two as replies
end and the next ones start, and a record per exact size split the evidence
until no size had the 16 steps a verdict needs (8 clients on a server moved
between 5 and 8). Neighbouring sizes cost alike; a band is measured as one.

It changes only how many tokens are drafted, never which are kept: output is
unchanged either way.
"""

from __future__ import annotations

from dataclasses import dataclass, field

POLICY, PLAIN, FULL = "policy", "plain", "full"
MODES = (POLICY, PLAIN, FULL)  # the order a new band tries them in, after the one it starts with
STRETCH = 8  # steps a mode is kept for before it is judged or swapped
REVISIT = 12  # stretches of the best mode before another is tried again
FORGET = 0.9  # the weight a mode's earlier steps keep, per stretch (of any mode) since
# a way wins over the policy only by more than this (ties keep the policy, which the user asked for)
MARGIN = 0.02
MIN_TRIAL = 4  # steps a way tried against another is kept for at least ...
CUT = 0.85  # ... before it stops where it runs below this share of the best other way's rate
BACKOFF = 4  # a revisit that confirms the best doubles the wait for the next, up to this many times REVISIT


@dataclass
class _Size:
    """What one batch size measured: per mode, (tokens, seconds), decayed per stretch."""

    sums: dict[str, list[float]] = field(default_factory=lambda: {m: [0.0, 0.0] for m in MODES})
    mode: str = POLICY
    left: int = STRETCH  # steps left in the current stretch
    since: int = 0  # stretches of the best mode since another was tried
    tried: set[str] = field(default_factory=set)  # the modes that ran a stretch
    turn: int = 0  # which of the others is tried next
    leader: str | None = None  # the best at the last verdict (None before every mode ran)
    revisit: int = REVISIT  # stretches of the best before another is tried again (grows as revisits confirm it)
    stretch: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])  # this stretch's tokens, seconds, steps

    def rate(self, mode: str) -> float | None:
        tokens, seconds = self.sums[mode]
        return tokens / seconds if seconds > 0 else None

    def best(self) -> str:
        """The mode measured fastest; the policy unless another beats it by :data:`MARGIN`, full depth
        unless plain steps beat it so."""
        rates = {m: r for m in MODES if (r := self.rate(m)) is not None}
        best = max(rates, key=lambda m: rates[m])
        for keep in (POLICY, FULL):
            if keep in rates and rates[best] <= rates[keep] * (1 + MARGIN):
                return keep
        return best

    def losing(self) -> bool:
        """This stretch has run :data:`MIN_TRIAL` counted steps below :data:`CUT` of the best rate another way
        measured: it ends now, to a verdict (a way being tried goes back to the best; the best, where it fell
        so far behind, is judged again)."""
        tokens, seconds, steps = self.stretch
        if steps < MIN_TRIAL:
            return False
        others = [r for m in MODES if m != self.mode and (r := self.rate(m)) is not None]
        return bool(others) and seconds > 0 and tokens / seconds < CUT * max(others)


def band(n_seq: int) -> int:
    """The band a batch of ``n_seq`` sequences is judged in, named by its largest size: 1, 2, 4, 8, 16, ..."""
    return 1 << max(0, n_seq - 1).bit_length()


class DraftingGate:
    """Per band of sequences decoding: how the batch drafts this step (see module)."""

    def __init__(self) -> None:
        self.sizes: dict[int, _Size] = {}  # by band

    def mode(self, n_seq: int) -> str:
        """:data:`POLICY`: the batch policy chooses this step's depths; :data:`PLAIN`: every sequence takes a
        plain step; :data:`FULL`: every sequence drafts as deep as it may."""
        return self._size(n_seq).mode

    def _size(self, n_seq: int) -> _Size:
        """A band's record; a new one starts plain where a smaller band found plain steps better than
        drafting (more sequences make verify rows dearer, not cheaper), else with the policy."""
        key = band(n_seq)
        if key not in self.sizes:
            lost = any(k < key and s.mode == PLAIN and len(s.tried) > 1 for k, s in self.sizes.items())
            self.sizes[key] = _Size(mode=PLAIN if lost else POLICY)
        return self.sizes[key]

    def observe(self, n_seq: int, tokens: int, seconds: float, drafted: bool = True) -> None:
        """A whole step of ``n_seq`` sequences made ``tokens`` in ``seconds`` in the mode :meth:`mode` gave;
        ``drafted``: whether the policy drafted by choice in it (a probe is not a choice). A step of the
        policy's that stayed plain counts toward its stretch but not its rate (see the module docstring)."""
        size = self._size(n_seq)
        if size.mode != POLICY or drafted:
            for part in (size.sums[size.mode], size.stretch):
                part[0] += tokens
                part[1] += seconds
            size.stretch[2] += 1
        size.left -= 1
        if size.left > 0 and not size.losing():
            return
        size.left, size.stretch = STRETCH, [0.0, 0.0, 0.0]
        ran = size.mode
        size.tried.add(ran)
        untried = [m for m in MODES if m not in size.tried]
        if untried:  # each measured once first
            size.mode = untried[0]
        else:
            best = size.best()  # (plain and full depth always measure: their steps all count)
            if best != size.leader:  # a new best (or the first verdict): the others are looked at again soon
                size.revisit = REVISIT
            elif ran != best:  # a revisit that confirmed the best: the next one later
                size.revisit = min(2 * size.revisit, BACKOFF * REVISIT)
            size.leader = best
            size.since = size.since + 1 if ran == best else 0
            size.mode = best
            if size.since >= size.revisit:  # another, again: each of the others in turn
                others = [m for m in MODES if m != best]
                size.mode, size.since = others[size.turn % len(others)], 0
                size.turn += 1
        for mode in MODES:  # what was measured a stretch ago weighs less; a rate is unchanged until measured again
            size.sums[mode] = [v * FORGET for v in size.sums[mode]]

    def summary(self) -> dict[int, tuple[str, dict[str, float | None]]]:
        """Per band (by its largest size): the mode in use, and the tokens/s measured in each mode."""
        return {n: (s.mode, {m: s.rate(m) for m in MODES}) for n, s in sorted(self.sizes.items())}
