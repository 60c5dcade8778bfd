"""Whether drafting pays at all in a batch of this many sequences, measured whole.

The batch policy (adaptive/batch.py) chooses depths from a cost model: verify
rows by total batch rows, draft steps by part per step and part per sequence,
a lazy head's waiting rows as an entry cost. What it does not see still costs:
Python around every round of every sequence, rows a resuming head decodes in
ways the fit smooths over, acceptance that is exact per token but not per
chain. At 8 sequences on a CPU those misses cost more than drafting wins
(docs/benchmarks.md: adaptive depth at 0.75-0.84x of MTP off). So the gate
times what the user gets — tokens out per second of whole steps — for the
policy's choices and for no drafting at all, per number of sequences, and
keeps to the better one, trying the other for a stretch of steps now and then
so that a change (a longer context, another text) is seen. A stretch, not a
step: a resume's cost falls on the first drafting steps after plain ones, and
a lone step of each would charge drafting for a resume every time.

Only steps in which the policy drafted by choice count for it: a step it keeps
plain (with at most a probe) says nothing about drafting. Counted whole, the
first stretches at a new batch size were mostly those, while the policy was
still learning acceptance from probes; plain steps then "won" by the noise
between two plain measurements, and the gate kept plain for the next 96 steps,
in which the policy could not learn (in process on the bench-size oracle model,
4 sequences: 4 tokens drafted in 196 steps, where a fixed depth 3 ran 1.1x
faster than MTP off; docs/benchmarks.md).

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

POLICY, PLAIN = "policy", "plain"
STRETCH = 8  # steps a mode is kept for before it is judged or swapped
REVISIT = 12  # stretches of the better mode before the other is tried again
FORGET = 0.9  # the weight a mode's earlier steps keep, per stretch of it measured
MARGIN = 0.02  # plain wins only by more than this (ties keep drafting, which the user asked for)


@dataclass
class _Size:
    """What one batch size measured: per mode, (tokens, seconds), decayed per stretch."""

    sums: dict[str, list[float]] = field(default_factory=lambda: {POLICY: [0.0, 0.0], PLAIN: [0.0, 0.0]})
    mode: str = POLICY
    left: int = STRETCH  # steps left in the current stretch
    since: int = 0  # stretches of the better mode since the other was tried

    def rate(self, mode: str) -> float | None:
        tokens, seconds = self.sums[mode]
        return tokens / seconds if seconds > 0 else None


def band(n_seq: int) -> int:
    """The band a batch of ``n_seq`` sequences is judged in, named by its largest size: 1, 2, 4, 8, 16, ..."""
    return 1 << max(0, n_seq - 1).bit_length()


class DraftingGate:
    """Per band of sequences decoding: whether to let the batch policy draft this step (see module)."""

    def __init__(self) -> None:
        self.sizes: dict[int, _Size] = {}  # by band

    def drafts(self, n_seq: int) -> bool:
        """Whether the batch policy chooses this step's depths (else every sequence takes a plain step)."""
        return self._size(n_seq).mode == POLICY

    def _size(self, n_seq: int) -> _Size:
        """A band's record; a new one starts plain where a smaller band found plain steps better (more
        sequences make verify rows dearer, not cheaper), else with the policy."""
        key = band(n_seq)
        if key not in self.sizes:
            lost = any(k < key and s.mode == PLAIN and s.rate(POLICY) is not None for k, s in self.sizes.items())
            self.sizes[key] = _Size(mode=PLAIN if lost else POLICY)
        return self.sizes[key]

    def observe(self, n_seq: int, tokens: int, seconds: float, drafted: bool = True) -> None:
        """A whole step of ``n_seq`` sequences made ``tokens`` in ``seconds`` in the mode :meth:`drafts` gave;
        ``drafted``: whether the policy drafted by choice in it (a probe is not a choice). A step of the
        policy's that stayed plain is not counted (see the module docstring)."""
        size = self._size(n_seq)
        if size.mode == POLICY and not drafted:
            return
        s = size.sums[size.mode]
        s[0] += tokens
        s[1] += seconds
        size.left -= 1
        if size.left > 0:
            return
        size.left = STRETCH
        policy, plain = size.rate(POLICY), size.rate(PLAIN)
        ran = size.mode
        if plain is None or policy is None:  # the other not yet measured: try it once
            size.mode = PLAIN if plain is None else POLICY
        else:
            better = PLAIN if plain > policy * (1 + MARGIN) else POLICY
            size.since = size.since + 1 if ran == better else 0
            size.mode = better
            if size.since >= REVISIT:  # the other, again
                size.mode, size.since = (POLICY if better == PLAIN else PLAIN), 0
        size.sums[ran] = [v * FORGET for v in size.sums[ran]]  # older stretches of this mode weigh less

    def summary(self) -> dict[int, tuple[str, float | None, float | None]]:
        """Per band (by its largest size): the mode in use, and the tokens/s measured with the policy and plain."""
        return {n: (s.mode, s.rate(POLICY), s.rate(PLAIN)) for n, s in sorted(self.sizes.items())}
