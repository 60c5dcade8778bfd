"""Online adaptive draft depth: each round drafts the number of tokens that
maximises expected tokens per second on this machine, now.

Why: the best fixed ``n_max`` depends on how predictable the text is, and
real replies mix easy stretches (boilerplate, quoted code) with hard ones
(reasoning), so the right depth changes from round to round. A fixed depth
is the best any anchor offers; this policy follows the text.

The model behind a choice of depth ``n`` (0 is a plain step):

- acceptance: ``q_i`` = probability that draft position ``i`` is accepted
  given that positions ``0..i-1`` were. Counted per position with
  exponential forgetting (each new observation of a position multiplies its
  old counts by :data:`DECAY`), so it follows the recent text. A position
  not seen lately leans on the one before it (a Beta prior centred there),
  and a position beyond the drafts of a round fades slowly back to that
  prior (:data:`IDLE_DECAY`), so a depth judged on bad luck is tried again
  (plain steps leave the counts alone: the probes re-try position 0).
  Expected tokens from a round of ``n``: ``E(n) = 1 + sum_{i<n} prod_{j<=i} q_j``
  (the target's own token always counts).
- acceptance comes in stretches: quoted code is easy for a while, reasoning
  hard for a while. So ``q_i`` is also counted per *context* — whether the
  last round that drafted kept every draft (:data:`AFTER_FULL`) or lost one
  (:data:`AFTER_MISS`) — and the round uses its context's counts, with the
  pooled ``q_i`` above as their prior (:data:`CONTEXT_PRIOR_WEIGHT`). On
  text whose difficulty does not come in stretches both contexts learn the
  pooled values and nothing changes; where it does, the first miss of a hard
  stretch switches to what hard stretches cost last time instead of waiting
  for the decayed pooled counts to fall (several full-depth rounds that each
  keep one token), and the first full accept switches back. A reply starts
  from the pooled counts (:meth:`AdaptiveDepth.new_reply`).
- cost: ``T(n) = verify(n + 1) + n * draft_step + overhead``. ``verify(k)`` is
  the measured time of a verify batch of ``k`` rows (an average per ``k``;
  a ``k`` never measured comes from its measured neighbours,
  :meth:`AdaptiveDepth.verify_cost`), ``draft_step`` the measured time of
  one draft token, ``overhead`` the rest of a round (catch-up, sampling, the
  loop). On this project's CPU a verify batch of 5 rows costs ~3.3x one row
  on a mixture-of-experts model (docs/benchmarks.md), which is what makes
  depth expensive; on a GPU it costs about one row.

The round drafts ``argmax_n E(n) / T(n)``; the drafter's ``p_min`` still
stops a draft early at an unsure token (the second brake). When the answer
is 0 the policy probes with one draft token now and then, so a stretch of
easy text is found again: after a miss, when easy stretches pay, at the gap
that weighs a probe's cost against finding a stretch late
(:meth:`AdaptiveDepth.probe_gap`); otherwise after :data:`PROBE_FIRST`
plain steps, doubling to :data:`PROBE_MAX` while probes keep failing.

It never changes output: every draft is verified by the target as before,
and the depth only decides how many rows a verify batch has. The choice
depends on timings, so *which* rounds draft differs run to run; the emitted
tokens do not (greedy), and each sampled token is still the target's sample
(the sampler draws once per emitted token, whatever the depth).
"""

from __future__ import annotations

from dataclasses import dataclass, field

DECAY = 0.95  # per observation of a position: ~20 recent rounds carry most weight (stretches: the contexts)
IDLE_DECAY = 0.97  # per round whose draft stops short of a position: its evidence fades back to the prior
PRIOR_WEIGHT = 1.0  # pseudo-observations behind the prior of each position
AFTER_FULL, AFTER_MISS = 0, 1  # contexts: the last drafting round kept every draft / lost one
FRESH = 2  # a reply's first rounds, before it drafted: the pooled counts (the last reply's end says little)
CONTEXT_PRIOR_WEIGHT = 2.0  # pseudo-observations of the pooled q_i behind a context's own
PRIOR_FIRST = 0.6  # prior acceptance of position 0: optimistic enough to try drafting at all
# verify(k) / verify(1) - 1 per extra row before two sizes were measured, and the most
# a row past the largest timed size is assumed to add (AdaptiveDepth.row_slope)
PRIOR_ROW_SLOPE = 0.4
PRIOR_DRAFT_SHARE = 0.2  # one draft step / one verify row, before a draft was timed
COST_EMA = 0.2  # weight of the newest timing in the moving averages
# A timing is clipped to this factor of its average before it counts: one
# preempted decode (another program took the core) must not make a depth look
# slow for good, since a depth judged slow is not tried again soon.
COST_CLIP = 1.5
CLIP_AFTER = 3  # samples behind an average before its samples are clipped
PROBE_FIRST = 8  # plain steps before the first probe when drafting does not pay
PROBE_MAX = 64  # the longest wait between probes
HAZARD_PRIOR = 1 / 32  # easy stretches found per plain step searched, before any were counted
HAZARD_PRIOR_STEPS = 32.0  # plain steps' worth of weight behind that prior
HAZARD_DECAY = 0.99  # per plain step searched
RECHECK_PLAIN = 4  # between plain steps the choice is made again every this many (it costs ~0.1 ms)


@dataclass
class AdaptiveDepth:
    """Chooses each round's draft length; fed what each round measured.

    Args:
        n_max: the deepest draft it may choose (the settings' ``n_max``,
            already limited to what the model drafts).
    """

    n_max: int
    reached: list[float] = field(default_factory=list)  # decayed rounds that drafted position i after i-1 accepted
    accepted: list[float] = field(default_factory=list)  # of those, decayed rounds that accepted position i
    # the same counts per context (AFTER_FULL, AFTER_MISS): (reached, accepted)
    by_context: dict[int, tuple[list[float], list[float]]] = field(default_factory=dict)
    context: int = AFTER_FULL  # the context of the next round
    steps_searched: float = 0.0  # decayed plain steps after a miss
    stretches_found: float = 0.0  # decayed drafting rounds after a miss that kept every draft
    verify_s: dict[int, float] = field(default_factory=dict)  # rows -> moving average seconds
    verify_n: dict[int, int] = field(default_factory=dict)  # rows -> samples behind that average
    plain_round_s: float | None = None  # average time of a plain step
    probe_round_s: float | None = None  # average time of a probe's round, whatever the kind of probe
    draft_step_s: float | None = None
    overhead_s: float | None = None
    depth: int = 0  # the last choice
    probe_every: int = PROBE_FIRST
    plain_steps: int = 0
    probing: bool = False
    # False: the costs stay as given (verify_s, draft_step_s, overhead_s) and only acceptance is learned —
    # for tests, whose outcome must not hang on how fast this machine happened to be
    timed: bool = True
    # True: a probe is a shadow probe — drafted, not verified; the plain step's own token tells
    # whether the draft would have been accepted (the loop sets it when its drafter allows it)
    shadow: bool = False

    def __post_init__(self) -> None:
        self.reached = [0.0] * self.n_max
        self.accepted = [0.0] * self.n_max
        self.by_context = {c: ([0.0] * self.n_max, [0.0] * self.n_max) for c in (AFTER_FULL, AFTER_MISS)}

    # -- the model ----------------------------------------------------------
    def pooled_acceptance(self) -> list[float]:
        """``q_i`` over every round: recent counts plus a prior at the position before."""
        out: list[float] = []
        prior = PRIOR_FIRST
        for r, a in zip(self.reached, self.accepted, strict=True):
            q = (a + PRIOR_WEIGHT * prior) / (r + PRIOR_WEIGHT)
            out.append(q)
            prior = q
        return out

    def acceptance(self, context: int | None = None) -> list[float]:
        """``q_i`` in ``context`` (default: the next round's): its own counts, the pooled ``q_i`` as prior."""
        context = self.context if context is None else context
        if context == FRESH:
            return self.pooled_acceptance()
        reached, accepted = self.by_context[context]
        return [(a + CONTEXT_PRIOR_WEIGHT * q) / (r + CONTEXT_PRIOR_WEIGHT)
                for r, a, q in zip(reached, accepted, self.pooled_acceptance(), strict=True)]

    def expected_tokens(self, n: int, q: list[float] | None = None) -> float:
        q = self.acceptance() if q is None else q
        total, reach = 1.0, 1.0
        for i in range(n):
            reach *= q[i]
            total += reach
        return total

    def verify_cost(self, rows: int) -> float:
        """Seconds for a verify batch of ``rows`` rows: measured, else from the sizes that were.

        A size never timed lies on the line between its timed neighbours; past
        the largest timed size it grows by :meth:`row_slope`, which leans
        optimistic, so an untried depth is tried and then judged on its own
        timing. No size costs more than a larger one timed cheaper: one slow
        sample (another program took the core) is capped by its neighbours
        instead of ruling a depth out.
        """
        seen = sorted(self.verify_s.items())
        if not seen:
            return 1.0 + PRIOR_ROW_SLOPE * (rows - 1)  # unitless until timed: only ratios matter
        below = [(k, t) for k, t in seen if k < rows]
        above = [(k, t) for k, t in seen if k > rows]
        if rows in self.verify_s:
            cost = self.verify_s[rows]
        elif below and above:
            (k0, t0), (k1, t1) = below[-1], above[0]
            cost = t0 + (t1 - t0) * (rows - k0) / (k1 - k0)
        elif below:
            k0, t0 = below[-1]
            cost = t0 + self.row_slope() * (rows - k0)
        else:
            k1, t1 = above[0]
            cost = t1 * (1 + PRIOR_ROW_SLOPE * (rows - 1)) / (1 + PRIOR_ROW_SLOPE * (k1 - 1))
        return min([cost, *(t for _, t in above)])

    def row_slope(self) -> float:
        """Seconds one more verify row adds, past the largest size timed.

        The smallest slope between timed neighbours, and at most
        :data:`PRIOR_ROW_SLOPE` of a one-row verify — optimistic on purpose: on
        a mixture-of-experts model the second row alone doubles the experts
        read, and later rows add much less.
        """
        sizes = sorted(self.verify_s.items())
        slopes = [(t1 - t0) / (k1 - k0) for (k0, t0), (k1, t1) in zip(sizes, sizes[1:], strict=False)]
        one = self.verify_s.get(1) or sizes[0][1]
        return max(0.0, min([PRIOR_ROW_SLOPE * one, *slopes]))

    def round_cost(self, n: int) -> float:
        v1 = self.verify_cost(1)
        step = self.draft_step_s if self.draft_step_s is not None else PRIOR_DRAFT_SHARE * v1
        overhead = self.overhead_s if self.overhead_s is not None else 0.0
        return self.verify_cost(n + 1) + n * step + overhead

    def rates(self, cap: int, context: int | None = None) -> list[float]:
        """Expected tokens per second of a round of each depth ``0..cap`` in ``context``."""
        q = self.acceptance(context)
        verify = [self.verify_cost(k) for k in range(1, cap + 2)]
        step = self.draft_step_s if self.draft_step_s is not None else PRIOR_DRAFT_SHARE * verify[0]
        overhead = self.overhead_s or 0.0
        out, expected, reach = [], 1.0, 1.0
        for n in range(cap + 1):
            if n:
                reach *= q[n - 1]
                expected += reach
            out.append(expected / (verify[n] + n * step + overhead))
        return out

    def best(self, cap: int, context: int | None = None) -> int:
        """The depth in ``0..cap`` with the most expected tokens per second (ties: the shallower)."""
        rates = self.rates(cap, context)
        return rates.index(max(rates))

    def probe_gap(self, cap: int) -> int:
        """Plain steps until the next probe.

        After a miss, when easy stretches pay (drafting after a full accept is
        faster than plain steps): probing every ``m`` steps costs ``c / m`` per
        step (``c``: a probe's extra verify row and draft step, in plain steps)
        and finds a new easy stretch ``m / 2`` tokens late on average, each
        token losing ``g`` (the share of a plain step drafting saves there);
        with easy stretches starting at a rate ``h`` per plain step that is
        ``c / m + h * g * m / 2``, least at ``m = sqrt(2 c / (h g))``. ``h`` is
        counted (probes that found one per plain step searched); ``c`` is
        measured too, once probes were timed (a probe's round against a plain
        step: the MTP catch-up of the plain steps before it rides along), and
        modelled before (a shadow probe, :attr:`shadow`, costs its draft step;
        a verified one also its second verify row). Otherwise
        probes back off, doubling up to :data:`PROBE_MAX`: text without easy
        stretches keeps them rare.
        """
        doubled = min(PROBE_MAX, 2 * self.probe_every)
        if self.context != AFTER_MISS or cap < 1:
            return doubled
        full = self.rates(cap, AFTER_FULL)
        plain = full[0]
        if max(full) <= plain:
            return doubled
        gain = 1.0 - plain / max(full)
        if self.plain_round_s and self.probe_round_s is not None:
            # measured: everything a probe's round adds to a plain step, the MTP catch-up decode
            # of the plain steps before it included (a batch of a few rows costs more per row)
            cost = max(0.0, self.probe_round_s - self.plain_round_s) / self.plain_round_s
        else:
            v1 = self.verify_cost(1) + (self.overhead_s or 0.0)
            step = self.draft_step_s if self.draft_step_s is not None else PRIOR_DRAFT_SHARE * v1
            extra_row = 0.0 if self.shadow else self.verify_cost(2) - self.verify_cost(1)
            cost = max(0.0, extra_row + step) / v1
        hazard = (self.stretches_found + HAZARD_PRIOR * HAZARD_PRIOR_STEPS) / (self.steps_searched
                                                                             + HAZARD_PRIOR_STEPS)
        return int(min(PROBE_MAX, max(2.0, (2.0 * cost / (hazard * gain)) ** 0.5)))

    # -- the loop's calls ---------------------------------------------------
    def new_reply(self) -> None:
        """A generation starts: its first rounds use the pooled counts, not the context the
        last reply ended in (a reply that ended in a hard stretch says little about how the
        next one starts), and a plain-step streak does not carry over."""
        self.context = FRESH
        self.plain_steps = 0
        self.probing = False

    def choose(self, room: int) -> int:
        """This round's draft length, at most ``room`` (what is left of the reply and context)."""
        cap = max(0, min(self.n_max, room))
        if self.depth == 0 and not self.probing and self.plain_steps % RECHECK_PLAIN:
            n = 0  # plain steps: acceptance is unchanged, only timings drift; look again every few
        else:
            n = self.best(cap) if cap else 0
        self.probing = False
        if n == 0 and cap:
            self.plain_steps += 1
            if self.plain_steps >= self.probe_every:
                self.plain_steps = 0
                self.probe_every = self.probe_gap(cap)
                self.probing = True
                n = 1
        elif n:
            self.plain_steps = 0
            self.probe_every = PROBE_FIRST
        self.depth = n
        return n

    def observe(self, n_drafted: int, n_accepted: int, verify_s: float, draft_s: float, round_s: float,
                shadow: bool = False) -> None:
        """What one round measured: drafts proposed and accepted, and where its time went.

        ``shadow``: the round was a plain step with a shadow probe — ``n_drafted``
        drafts not verified, ``n_accepted`` of them equal to what the target produced.
        """
        if self.timed:
            self._observe_costs(0 if shadow else n_drafted, n_drafted, verify_s, draft_s, round_s)
            if self.probing:
                self.probe_round_s = _average(self.probe_round_s, round_s)
            elif not self.depth:  # a plain step by choice (a draft the drafter declined costs its decode)
                self.plain_round_s = _average(self.plain_round_s, round_s)
        counts = [(self.reached, self.accepted)]
        if self.context in self.by_context:
            counts.append(self.by_context[self.context])
        for reached, accepted in counts:
            for i in range(min(n_accepted + 1, n_drafted, self.n_max)):
                reached[i] = DECAY * reached[i] + 1.0
                accepted[i] = DECAY * accepted[i] + (1.0 if i < n_accepted else 0.0)
            # positions past a draft fade, so a deeper draft is tried again some day; a plain
            # step leaves them alone (position 0 is re-tried by the probes, with backoff)
            for i in range(n_drafted if n_drafted else self.n_max, self.n_max):
                reached[i] *= IDLE_DECAY
                accepted[i] *= IDLE_DECAY
        if self.context == AFTER_MISS:  # searching for the next easy stretch (see probe_gap)
            if not n_drafted or self.probing:  # a probe's round is a step of the search too
                self.steps_searched = HAZARD_DECAY * self.steps_searched + 1.0
                self.stretches_found *= HAZARD_DECAY
            if n_drafted and n_accepted >= n_drafted:
                self.stretches_found += 1.0
        if n_drafted:  # a plain step says nothing about the text: the context stays
            self.context = AFTER_FULL if n_accepted >= n_drafted else AFTER_MISS

    def _observe_costs(self, n_verified: int, n_drafted: int, verify_s: float, draft_s: float,
                       round_s: float) -> None:
        rows = n_verified + 1
        # A size timed for the first time starts from what two or more timed sizes predict, as
        # one pseudo-sample, so one slow first sample cannot rule a depth out. Not from the prior
        # slope: that is a CPU's, and on hardware where rows are cheap it would stick to the size.
        old, seen = self.verify_s.get(rows), self.verify_n.get(rows, 0)
        if seen < CLIP_AFTER:
            # A young estimate is not clipped against itself, but a slow sample is still capped at
            # COST_CLIP times what the other sizes predict (the prior slope's line when only one
            # size was timed: at worst too generous). Else one preempted decode of the largest
            # size timed would make it, and every deeper size extrapolated from it, look too
            # slow to try again; a shadow probe never re-times two rows.
            verify_s = min(verify_s, COST_CLIP * self._predicted(rows))
        if old is None and len(self.verify_s) >= 2:
            old, seen = self.verify_cost(rows), 1
        self.verify_s[rows] = _average(old, verify_s, seen)
        self.verify_n[rows] = seen + 1
        if n_drafted:
            self.draft_step_s = _average(self.draft_step_s, draft_s / n_drafted)
        self.overhead_s = _average(self.overhead_s, max(0.0, round_s - verify_s - draft_s))

    def _predicted(self, rows: int) -> float:
        """What the timed sizes other than ``rows`` say a verify of ``rows`` rows costs."""
        own, count = self.verify_s.pop(rows, None), self.verify_n.pop(rows, None)
        try:
            if not self.verify_s:
                return float("inf")  # nothing else timed: nothing to cap by
            if len(self.verify_s) == 1:
                (k0, t0), = self.verify_s.items()
                return t0 * (1 + PRIOR_ROW_SLOPE * (rows - 1)) / (1 + PRIOR_ROW_SLOPE * (k0 - 1))
            return self.verify_cost(rows)
        finally:
            if own is not None:
                self.verify_s[rows] = own
            if count is not None:
                self.verify_n[rows] = count


def _average(old: float | None, sample: float, seen: int | None = None) -> float:
    """The average after ``sample``, given ``seen`` samples (or pseudo-samples) behind ``old``.

    The first few are a plain mean (a young estimate must move fast), later ones
    an exponential average (:data:`COST_EMA`); once :data:`CLIP_AFTER` samples
    stand behind it (``seen`` None: an established average), a sample is
    clipped to :data:`COST_CLIP` times the average.
    """
    if old is None:
        return sample
    if seen is None or seen >= CLIP_AFTER:
        if old > 0:
            sample = min(max(sample, old / COST_CLIP), old * COST_CLIP)
        return old + COST_EMA * (sample - old)
    return old + max(COST_EMA, 1.0 / (seen + 1)) * (sample - old)
