"""What a round costs on this machine, now: verify batches by size, a draft step, the rest.

``T(n) = verify(n + 1) + n * draft_step + overhead``. ``verify(k)`` is the
measured time of a verify batch of ``k`` rows (a moving average per ``k``); a
``k`` never timed comes from its timed neighbours (:func:`verify_cost`). On
this project's CPU a verify batch of 5 rows costs ~3.3x one row on a
mixture-of-experts model (docs/benchmarks.md), which is what makes depth
expensive; on a GPU it costs about one row.
"""

from __future__ import annotations

from engine.speculative.adaptive.params import AdaptiveParams


def _scaled(seconds: float, rows_timed: int, rows: int, slope: float) -> float:
    """A verify of ``rows`` rows from one timed size, by the prior's slope per row."""
    return seconds * (1 + slope * (rows - 1)) / (1 + slope * (rows_timed - 1))


def row_slope(timed: dict[int, float], prior_slope: float) -> float:
    """Seconds one more verify row adds, past the largest size timed.

    The least-squares slope over the larger half of the sizes timed (at least the
    two largest), and at most ``prior_slope`` of a one-row verify: on a
    mixture-of-experts model the second row alone doubles the experts read, and
    later rows add much less, so the small sizes do not count. It was the
    smallest slope between timed neighbours; a batch of sequences times many
    sizes (sequences join and end), each a noisy average, and one pair timed
    the wrong way round made every row past the largest size free: measured at
    8 sequences, verify(32) was priced at verify(15)'s 54.7 ms where a line
    through the sizes timed says 118 ms, and the batch drafted at break-even.
    Where one row was never timed (a batch of N sequences verifies N rows at
    least) it is what the smallest timed size says by the prior's shape: taking
    that whole batch for "one row" priced each extra row at 0.4 of the batch,
    and adaptive depth under concurrency never drafted enough to learn better.
    """
    sizes = sorted(timed.items())
    one = timed.get(1) or _scaled(sizes[0][1], sizes[0][0], 1, prior_slope)
    upper = sizes[len(sizes) // 2:] if len(sizes) >= 4 else sizes[-2:]
    if len(upper) < 2:
        return prior_slope * one
    mean_k = sum(k for k, _ in upper) / len(upper)
    mean_t = sum(t for _, t in upper) / len(upper)
    spread = sum((k - mean_k) ** 2 for k, _ in upper)
    slope = sum((k - mean_k) * (t - mean_t) for k, t in upper) / spread
    return max(0.0, min(prior_slope * one, slope))


def verify_cost(timed: dict[int, float], rows: int, prior_slope: float) -> float:
    """Seconds for a verify batch of ``rows`` rows: timed, else from the sizes that were.

    A size never timed lies on the line between its timed neighbours; past the
    largest timed size it grows by :func:`row_slope`, which leans optimistic, so
    an untried depth is tried and then judged on its own timing. No size costs
    more than a larger one timed cheaper: one slow sample is capped by its
    neighbours instead of ruling a depth out.
    """
    if not timed:
        return 1.0 + prior_slope * (rows - 1)  # unitless until timed: only ratios matter
    seen = sorted(timed.items())
    below = [(k, t) for k, t in seen if k < rows]
    above = [(k, t) for k, t in seen if k > rows]
    if rows in timed:
        cost = timed[rows]
    elif below and above:
        (k0, t0), (k1, t1) = below[-1], above[0]
        cost = t0 + (t1 - t0) * (rows - k0) / (k1 - k0)
    elif below:
        k0, t0 = below[-1]
        cost = t0 + row_slope(timed, prior_slope) * (rows - k0)
    else:
        k1, t1 = above[0]
        cost = _scaled(t1, k1, rows, prior_slope)
    return min([cost, *(t for _, t in above)])


class Costs:
    """Moving averages of what rounds cost; ``timed=False`` keeps them as given (tests, whose
    outcome must not hang on how fast this machine happened to be)."""

    def __init__(self, params: AdaptiveParams, verify_s: dict[int, float] | None = None,
                 draft_step_s: float | None = None, overhead_s: float | None = None, timed: bool = True) -> None:
        self.params, self.timed = params, timed
        self.verify_s: dict[int, float] = dict(verify_s or {})  # rows -> moving average seconds
        self.verify_n: dict[int, int] = {}  # rows -> samples behind that average
        self.draft_step_s, self.overhead_s = draft_step_s, overhead_s
        self.plain_round_s: float | None = None  # a plain step by choice
        self.probe_round_s: float | None = None  # a probe's round, whatever the kind of probe
        self._trusted: dict[int, float] | None = None  # verify_s as read (see trusted), until a new sample

    @classmethod
    def given(cls, verify_s: dict[int, float], draft_step_s: float, overhead_s: float = 0.0,
              params: AdaptiveParams | None = None) -> Costs:
        """Costs that stay as given (never timed)."""
        return cls(params or AdaptiveParams(), verify_s, draft_step_s, overhead_s, timed=False)

    def verify(self, rows: int) -> float:
        return verify_cost(self.trusted(), rows, self.params.prior_row_slope)

    def trusted(self) -> dict[int, float]:
        """The verify sizes as the policy reads them: a young one (fewer than ``clip_after`` samples) no
        dearer than the established sizes predict, as an untimed one is priced. Its first samples are often
        a graph built cold, and one such sample of the only drafting size timed (a lone probe's two-row
        verify at 2.6x one row where 1.4x is the prior) made drafting look hopeless even if every draft
        were kept: the policy never probed again, so never timed that size warm, and adaptive depth stayed
        plain for good after one early probe (through the server, after its warm-up request: no draft in
        six replies whose drafts a fixed depth kept every time). Priced so, the size is tried again and
        judged on its own timings once they are established."""
        if self._trusted is None:
            p = self.params
            established = {k: t for k, t in self.verify_s.items() if self.verify_n.get(k, 0) >= p.clip_after}
            self._trusted = dict(self.verify_s)
            if established:
                for k, t in self.verify_s.items():
                    if k not in established:
                        self._trusted[k] = min(t, verify_cost(established, k, p.prior_row_slope))
        return self._trusted

    def draft_step(self, one_row: float) -> float:
        """One draft token's time; before one was timed, the prior's share of ``one_row``."""
        return self.draft_step_s if self.draft_step_s is not None else self.params.prior_draft_share * one_row

    def round(self, n: int) -> float:
        """``T(n)``: a round drafting ``n`` tokens; a plain step as timed once one was.

        Modelled, a plain step was one verify row (extrapolated from the drafting sizes when a policy
        never stepped plainly) plus a drafting round's overhead, which a plain step does not pay (the
        head's catch-up, several rows sampled): on the bench-size glm4moe, one client, every draft kept,
        that priced it at ~1.3x what it took, and adaptive depth drafted at 0.95x the speed of not
        drafting at all."""
        if n == 0 and self.plain_round_s is not None:
            return self.plain_round_s
        return self.verify(n + 1) + n * self.draft_step(self.verify(1)) + (self.overhead_s or 0.0)

    def probe_cost(self, shadow: bool) -> float:
        """What a probe adds to a plain step, in plain steps: measured once probes were timed (the MTP
        catch-up of the plain steps before it rides along), else modelled (a shadow probe costs its draft
        step; a verified one also its second verify row)."""
        if self.plain_round_s and self.probe_round_s is not None:
            return max(0.0, self.probe_round_s - self.plain_round_s) / self.plain_round_s
        v1 = self.verify(1) + (self.overhead_s or 0.0)
        extra_row = 0.0 if shadow else self.verify(2) - self.verify(1)
        return max(0.0, extra_row + self.draft_step(v1)) / v1

    def observe(self, n_verified: int, n_drafted: int, verify_s: float, draft_s: float, round_s: float) -> None:
        """One round's timings: its verify of ``n_verified + 1`` rows, ``n_drafted`` draft steps, the whole."""
        rows = n_verified + 1
        old, seen = self.verify_s.get(rows), self.verify_n.get(rows, 0)
        if seen < self.params.clip_after:
            # A young estimate is not clipped against itself, but a slow sample is capped at cost_clip
            # times what the other sizes predict, else one preempted decode of the largest size timed
            # would make it, and every deeper size extrapolated from it, look too slow to try again.
            verify_s = min(verify_s, self.params.cost_clip * self._predicted(rows))
        if old is None and len(self.verify_s) >= 2:
            # a size timed for the first time starts from what the timed sizes predict, as one
            # pseudo-sample (not from the prior slope: that is a CPU's)
            old, seen = self.verify(rows), 1
        self.verify_s[rows] = self.average(old, verify_s, seen)
        self.verify_n[rows] = seen + 1
        self._trusted = None
        if n_drafted:
            self.draft_step_s = self.average(self.draft_step_s, draft_s / n_drafted)
        self.overhead_s = self.average(self.overhead_s, max(0.0, round_s - verify_s - draft_s))

    def _predicted(self, rows: int) -> float:
        """What the timed sizes other than ``rows`` say a verify of ``rows`` rows costs."""
        others = {k: t for k, t in self.verify_s.items() if k != rows}
        if not others:
            return float("inf")  # nothing else timed: nothing to cap by
        if len(others) == 1:
            ((k0, t0),) = others.items()
            return _scaled(t0, k0, rows, self.params.prior_row_slope)
        return verify_cost(others, rows, self.params.prior_row_slope)

    def average(self, old: float | None, sample: float, seen: int | None = None) -> float:
        """The average after ``sample``, given ``seen`` samples (or pseudo-samples) behind ``old``.

        The first few are a plain mean (a young estimate must move fast), later ones an
        exponential average (``cost_ema``); once ``clip_after`` samples stand behind it
        (``seen`` None: an established average), a sample is clipped to ``cost_clip`` times it.
        """
        p = self.params
        if old is None:
            return sample
        if seen is None or seen >= p.clip_after:
            if old > 0:
                sample = min(max(sample, old / p.cost_clip), old * p.cost_clip)
            return old + p.cost_ema * (sample - old)
        return old + max(p.cost_ema, 1.0 / (seen + 1)) * (sample - old)
