"""Draft depths for several sequences verified in one batch: the best *total* tokens per second.

Alone, a sequence drafts ``n`` where its expected tokens per second of a round
is highest. In a batch every sequence's rows share one verify decode, whose
cost depends on the total rows: where a row costs little (a GPU, a batch far
from compute-bound) drafting pays as alone; where each row costs about as much
as a plain step (a CPU, or a batch already compute-bound) a draft row must be
accepted more often than a plain row yields a token, and the answer is to stop
drafting — users see the MTP gain vanish at ``--parallel 4`` exactly there.

Draft steps are shared: the MTP lanes decode step i of every sequence that
drafts that deep in one decode of the draft context (engine/generation/parallel.py).
What such a step costs is part per step (the head's weights read once, the
call) and part per sequence in it (each sequence's row, and its LM-head row:
at a real vocabulary on a CPU that row is most of a draft step).
:class:`SharedSteps` fits both parts from the steps timed. Counting a whole
step per sequence, as a first version did, priced drafting N times too high
on a small vocabulary; counting one step for all, as a second did, priced it
far too low at 151,936 tokens, and adaptive depth drafted where it lost.

So the choice is made per deepest level ``L``: with ``L`` steps' fixed part
paid, add draft positions no deeper than ``L`` greedily — the one (to
whichever sequence) that raises the batch's expected tokens per second the
most, while one does — and keep the best level. A position's worth is the
chance it is accepted (the product of its sequence's ``q_i``, acceptance.py);
its cost a verify row (``verify`` timed by total rows, costs.py) and its row in
a draft step. With one sequence it is the single-sequence choice.
"""

from __future__ import annotations

from engine.speculative.adaptive.costs import Costs


def choose_depths(acceptance: list[list[float]], caps: list[int], costs: Costs, others: tuple[int, float] = (0, 0.0),
                  draft: tuple[float, float] | None = None) -> list[int]:
    """Each sequence's draft length for the next batch.

    Args:
        acceptance: per sequence, ``q_i`` for its draft positions.
        caps: per sequence, the most it may draft (its ``n_max``, what is left of its reply).
        costs: the batch's costs, verify timed by total rows.
        others: the rows other sequences add whatever is chosen here (fixed depths, plain requests),
            and the tokens they are expected to bring.
        draft: seconds of a shared draft step, per step and per sequence drafting in it
            (:meth:`SharedSteps.split`); default: ``costs``' draft step, all of it per step.
    """
    overhead = costs.overhead_s or 0.0
    per_step, per_row = draft if draft is not None else (costs.draft_step(costs.verify(1)), 0.0)
    rows0, tokens0 = len(caps) + others[0], len(caps) + others[1]  # each sequence's own row and token
    # every batch size the fills can reach, priced once: the greedy fills ask for the same sizes hundreds of
    # times a step with 8 sequences (~1 ms of Python a step before, against a 40 ms decode)
    most_rows = rows0 + sum(min(cap, len(q)) for q, cap in zip(acceptance, caps, strict=True))
    verify = [0.0] * rows0 + [costs.verify(k) for k in range(rows0, most_rows + 1)]
    best_depths, best = [0] * len(caps), tokens0 / (verify[rows0] + overhead)
    deepest = max((min(cap, len(q)) for q, cap in zip(acceptance, caps, strict=True)), default=0)
    for level in range(1, deepest + 1):
        depths, rate = _fill(acceptance, caps, verify, level, rows0, tokens0, level * per_step + overhead, per_row)
        if max(depths) == level and rate > best:  # a shallower fill was already judged at its own level
            best_depths, best = depths, rate
    return best_depths


def _fill(acceptance: list[list[float]], caps: list[int], verify: list[float], level: int, rows: int,
          expected: float, fixed_s: float, per_row: float) -> tuple[list[int], float]:
    """Greedy draft positions no deeper than ``level``, ``fixed_s`` (its draft steps' fixed part, the overhead)
    paid and ``per_row`` for each position's row in a draft step; the depths and the expected tokens per second.
    ``verify[k]``: a verify of ``k`` rows."""
    depths = [0] * len(caps)
    reach = [1.0] * len(caps)
    positions = 0

    def rate(tokens: float, n_rows: int, n_positions: int) -> float:
        return tokens / (verify[n_rows] + fixed_s + n_positions * per_row)

    best = rate(expected, rows, positions)
    while True:
        pick, pick_rate = -1, best
        for s, (q, cap) in enumerate(zip(acceptance, caps, strict=True)):
            n = depths[s]
            if n >= min(cap, len(q), level):
                continue
            candidate = rate(expected + reach[s] * q[n], rows + 1, positions + 1)
            if candidate > pick_rate:
                pick, pick_rate = s, candidate
        if pick < 0:
            return depths, best
        reach[pick] *= acceptance[pick][depths[pick]]
        expected += reach[pick]
        depths[pick] += 1
        rows, positions, best = rows + 1, positions + 1, pick_rate


class SharedSteps:
    """What a shared draft step costs: ``a`` per step and ``b`` per sequence drafting in it, fitted by least
    squares with forgetting to what the steps timed took (``seconds ~ a * steps + b * rows``).

    While the timings cannot tell the parts apart (nothing was timed, or every step had the same number
    of sequences: only one-sequence probes so far) the whole is counted per step: the hopeful side, as
    the single-sequence prior is (a policy that never drafts never learns). Once the batch has drafted
    with several sequences beside those probes, the fit splits it, and drafting stops where each
    sequence's row makes it dear (at a real vocabulary, on a CPU).
    """

    def __init__(self, decay: float = 0.95) -> None:
        self.decay = decay
        self._ss = self._sr = self._rr = self._st = self._rt = 0.0

    def observe(self, steps: int, rows: int, seconds: float) -> None:
        """One batch's drafting: ``steps`` shared decodes with ``rows`` sequence-steps in all, in ``seconds``."""
        if steps <= 0 or rows <= 0:
            return
        d = self.decay
        self._ss = d * self._ss + steps * steps
        self._sr = d * self._sr + steps * rows
        self._rr = d * self._rr + rows * rows
        self._st = d * self._st + steps * seconds
        self._rt = d * self._rt + rows * seconds

    def split(self, fallback: float) -> tuple[float, float]:
        """(per step, per sequence in a step) in seconds; ``fallback`` seconds per step before anything
        was timed."""
        if not self._ss:
            return fallback, 0.0
        det = self._ss * self._rr - self._sr * self._sr
        if det > 1e-3 * self._ss * self._rr:  # the step counts and the row counts vary apart
            a = (self._st * self._rr - self._sr * self._rt) / det
            b = (self._ss * self._rt - self._sr * self._st) / det
            if a >= 0 and b >= 0:
                return a, b
            if a < 0:  # a step costs nothing measurable beyond its rows: all per sequence
                return 0.0, max(0.0, self._rt / self._rr)
        return max(0.0, self._st / self._ss), 0.0
