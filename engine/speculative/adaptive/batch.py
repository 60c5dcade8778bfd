"""Draft depths for several sequences verified in one batch: the best *total* tokens per second.

Alone, a sequence drafts ``n`` where its expected tokens per second of a round
is highest. In a batch every sequence's rows share one verify decode, whose
cost depends on the total rows: where a row costs little (a GPU, a batch far
from compute-bound) drafting pays as alone; where each row costs about as much
as a plain step (a CPU, or a batch already compute-bound) a draft row must be
accepted more often than a plain row yields a token, and the answer is to stop
drafting — users see the MTP gain vanish at ``--parallel 4`` exactly there.

Draft steps are shared: the MTP lanes decode step i of every sequence that
drafts that deep in one decode of the draft context (engine/generation/parallel.py),
so a batch whose deepest draft is ``L`` pays ``L`` draft steps however many
sequences draft. Counting a step per sequence, as a first version did, priced
drafting N times too high with N sequences, and adaptive depth stopped drafting
where a fixed depth gained (docs/benchmarks.md, issue 27).

So the choice is made per deepest level ``L``: with ``L`` draft steps paid, add
draft positions no deeper than ``L`` greedily — the one (to whichever sequence)
that raises the batch's expected tokens per second the most, while one does —
and keep the best level. A position's worth is the chance it is accepted (the
product of its sequence's ``q_i``, acceptance.py); the batch's cost is
``verify(total rows) + L * draft step + overhead`` from
:class:`~engine.speculative.adaptive.costs.Costs` timed by total rows. With
one sequence it is the single-sequence choice.
"""

from __future__ import annotations

from engine.speculative.adaptive.costs import Costs


def choose_depths(acceptance: list[list[float]], caps: list[int], costs: Costs, others: tuple[int, float] = (0, 0.0),
                  ) -> list[int]:
    """Each sequence's draft length for the next batch.

    Args:
        acceptance: per sequence, ``q_i`` for its draft positions.
        caps: per sequence, the most it may draft (its ``n_max``, what is left of its reply).
        costs: the batch's costs, verify timed by total rows.
        others: the rows other sequences add whatever is chosen here (fixed depths, plain requests),
            and the tokens they are expected to bring.
    """
    overhead = costs.overhead_s or 0.0
    step = costs.draft_step(costs.verify(1))
    rows0, tokens0 = len(caps) + others[0], len(caps) + others[1]  # each sequence's own row and token
    best_depths, best = [0] * len(caps), tokens0 / (costs.verify(rows0) + overhead)
    deepest = max((min(cap, len(q)) for q, cap in zip(acceptance, caps, strict=True)), default=0)
    for level in range(1, deepest + 1):
        depths, rate = _fill(acceptance, caps, costs, level, rows0, tokens0, level * step + overhead)
        if max(depths) == level and rate > best:  # a shallower fill was already judged at its own level
            best_depths, best = depths, rate
    return best_depths


def _fill(acceptance: list[list[float]], caps: list[int], costs: Costs, level: int, rows: int, expected: float,
          fixed_s: float) -> tuple[list[int], float]:
    """Greedy draft positions no deeper than ``level``, ``fixed_s`` (its draft steps, the overhead) paid;
    the depths and the batch's expected tokens per second."""
    depths = [0] * len(caps)
    reach = [1.0] * len(caps)

    def rate(tokens: float, n_rows: int) -> float:
        return tokens / (costs.verify(n_rows) + fixed_s)

    best = rate(expected, rows)
    while True:
        pick, pick_rate = -1, best
        for s, (q, cap) in enumerate(zip(acceptance, caps, strict=True)):
            n = depths[s]
            if n >= min(cap, len(q), level):
                continue
            candidate = rate(expected + reach[s] * q[n], rows + 1)
            if candidate > pick_rate:
                pick, pick_rate = s, candidate
        if pick < 0:
            return depths, best
        reach[pick] *= acceptance[pick][depths[pick]]
        expected += reach[pick]
        depths[pick] += 1
        rows, best = rows + 1, pick_rate
