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

import numpy as np

from engine.speculative.adaptive.costs import Costs


def choose_depths(acceptance: list[list[float]], caps: list[int], costs: Costs, others: tuple[int, float] = (0, 0.0),
                  draft: tuple[float, float] | None = None, entry: list[float] | None = None) -> list[int]:
    """Each sequence's draft length for the next batch.

    Args:
        acceptance: per sequence, ``q_i`` for its draft positions.
        caps: per sequence, the most it may draft (its ``n_max``, what is left of its reply).
        costs: the batch's costs, verify timed by total rows.
        others: the rows other sequences add whatever is chosen here (fixed depths, plain requests),
            and the tokens they are expected to bring.
        draft: seconds of a shared draft step, per step and per sequence drafting in it
            (:meth:`SharedSteps.split`); default: ``costs``' draft step, all of it per step.
        entry: per sequence, seconds its drafting adds this step whatever its depth (a lazy head's
            waiting rows, :func:`entry_cost`); default none.
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
    entry = entry or [0.0] * len(caps)
    for level in range(1, deepest + 1):
        depths, rate = _fill(acceptance, caps, verify, level, rows0, tokens0, level * per_step + overhead, per_row,
                             entry)
        if max(depths) == level and rate > best:  # a shallower fill was already judged at its own level
            best_depths, best = depths, rate
    return best_depths


def _fill(acceptance: list[list[float]], caps: list[int], verify: list[float], level: int, rows: int,
          expected: float, fixed_s: float, per_row: float, entry: list[float]) -> tuple[list[int], float]:
    """Greedy draft positions no deeper than ``level``, ``fixed_s`` (its draft steps' fixed part, the overhead)
    paid and ``per_row`` for each position's row in a draft step; the depths and the expected tokens per second.
    ``verify[k]``: a verify of ``k`` rows. A sequence not yet drafting also pays its ``entry``; so that a
    dear entry is judged against all it buys, such a sequence is offered its best run of positions at once."""
    depths = [0] * len(caps)
    reach = [1.0] * len(caps)
    positions, entered = 0, 0.0

    def rate(tokens: float, n_rows: int, n_positions: int, entries: float) -> float:
        return tokens / (verify[n_rows] + fixed_s + n_positions * per_row + entries)

    best = rate(expected, rows, positions, entered)
    while True:
        pick, pick_n, pick_rate = -1, 0, best
        for s, (q, cap) in enumerate(zip(acceptance, caps, strict=True)):
            n, top = depths[s], min(cap, len(q), level)
            if n >= top:
                continue
            gained, chance = 0.0, reach[s]
            for k in range(1, (top - n if n == 0 and entry[s] else 1) + 1):
                chance *= q[n + k - 1]
                gained += chance
                candidate = rate(expected + gained, rows + k, positions + k, entered + (entry[s] if n == 0 else 0.0))
                if candidate > pick_rate:
                    pick, pick_n, pick_rate = s, k, candidate
        if pick < 0:
            return depths, best
        if depths[pick] == 0:
            entered += entry[pick]
        for _ in range(pick_n):
            reach[pick] *= acceptance[pick][depths[pick]]
            expected += reach[pick]
            depths[pick] += 1
        rows, positions, best = rows + pick_n, positions + pick_n, pick_rate


def entry_cost(waiting: int, steady: float, stretch: float, per_row: float) -> float:
    """Seconds a lazy head's ``waiting`` rows add to drafting now, as one round's share: the rows a lane
    brings every drafting round (``steady``, its last round's accepted rows and its own) count whole; the
    rest piled up while it did not draft, paid once when it starts again and spread over the ``stretch``
    of rounds it is expected to keep drafting. Priced whole, a lane that would gain for many rounds never
    resumed; not priced at all, eight lanes that resumed at break-even decoded up to 16 waiting rows each
    (19.7 ms against a 40 ms plain step on the bench-size mixture of experts; docs/benchmarks.md), and
    adaptive depth ran at 0.75-0.90x MTP-off with eight clients."""
    kept = min(float(waiting), steady)
    return per_row * (kept + (waiting - kept) / max(1.0, stretch))


class SharedSteps:
    """What a shared draft step costs: ``a`` per step, ``b`` per sequence drafting in it and ``c`` per
    catch-up row folded into it (a lane's rows from the verify before, decoded with its first draft step),
    fitted by least squares with forgetting to what the steps timed took
    (``seconds ~ a * steps + b * rows + c * catch_up``).

    While the timings cannot tell the parts apart (nothing was timed, or every step had the same number
    of sequences: only one-sequence probes so far) the whole is counted per step: the hopeful side, as
    the single-sequence prior is (a policy that never drafts never learns). Once the batch has drafted
    with several sequences beside those probes, the fit splits it, and drafting stops where each
    sequence's row makes it dear (at a real vocabulary, on a CPU). Catch-up rows are told apart once their
    count varied against the rest (lanes resuming after plain steps bring up to 16, drafting lanes 1 to 4);
    until then they are part of ``b``, as before they were counted at all.
    """

    def __init__(self, decay: float = 0.95) -> None:
        self.decay = decay
        self._xx = np.zeros((3, 3))  # decayed sums of x x^T, x = (steps, rows, catch_up)
        self._xy = np.zeros(3)  # decayed sums of x * seconds

    def observe(self, steps: int, rows: int, seconds: float, catch_up: int = 0) -> None:
        """One batch's drafting: ``steps`` shared decodes with ``rows`` sequence-steps and ``catch_up`` folded
        catch-up rows in all, in ``seconds``."""
        if steps <= 0 or rows <= 0:
            return
        x = np.array([steps, rows, catch_up], dtype=float)
        self._xx = self.decay * self._xx + np.outer(x, x)
        self._xy = self.decay * self._xy + x * seconds

    def split(self, fallback: float) -> tuple[float, float]:
        """(per step, per sequence in a step) in seconds; ``fallback`` seconds per step before anything
        was timed."""
        return self.parts(fallback)[:2]

    def catch_up_row(self) -> float:
        """Seconds one folded catch-up row adds to a draft step; 0 until the fit can tell (see the class)."""
        return self.parts(0.0)[2]

    def parts(self, fallback: float) -> tuple[float, float, float]:
        """(per step, per sequence in a step, per catch-up row)."""
        xx, xy = self._xx, self._xy
        if not xx[0, 0]:
            return fallback, 0.0, 0.0
        if xx[2, 2] > 0:
            scale = np.sqrt(np.diag(xx))
            normed = xx / np.outer(scale, scale)
            if np.linalg.det(normed) > 1e-4:  # the three counts varied apart: all three told apart
                a, b, c = np.linalg.solve(xx, xy)
                if min(a, b, c) >= 0:
                    return float(a), float(b), float(c)
        a, b = self._two_parts(xx[:2, :2], xy[:2])
        return a, b, 0.0

    @staticmethod
    def _two_parts(xx: np.ndarray, xy: np.ndarray) -> tuple[float, float]:
        """(per step, per sequence) without a catch-up term: its rows are then part of what a sequence costs."""
        ss, sr, rr = xx[0, 0], xx[0, 1], xx[1, 1]
        st, rt = xy
        det = ss * rr - sr * sr
        if det > 1e-3 * ss * rr:  # the step counts and the row counts vary apart
            a = (st * rr - sr * rt) / det
            b = (ss * rt - sr * st) / det
            if a >= 0 and b >= 0:
                return float(a), float(b)
            if a < 0:  # a step costs nothing measurable beyond its rows: all per sequence
                return 0.0, float(max(0.0, rt / rr))
        return float(max(0.0, st / ss)), 0.0
