"""Draft depths for several sequences verified in one batch: the best *total* tokens per second.

Alone, a sequence drafts ``n`` where its expected tokens per second of a round
is highest. In a batch every sequence's rows share one verify decode, whose
cost depends on the total rows: where a row costs little (a GPU, a batch far
from compute-bound) drafting pays as alone; where each row costs about as much
as a plain step (a CPU, or a batch already compute-bound) a draft row must be
accepted more often than a plain row yields a token, and the answer is to stop
drafting — users see the MTP gain vanish at ``--parallel 4`` exactly there.

The choice is greedy over draft positions: starting from plain steps for all,
add the one draft position (to whichever sequence) that raises the batch's
expected tokens per second the most, while one does. A position's worth is the
chance it is accepted (the product of its sequence's ``q_i``, acceptance.py);
the batch's cost is ``verify(total rows) + draft steps + overhead`` from
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
    depths = [0] * len(caps)
    reach = [1.0] * len(caps)
    rows, drafts = len(caps) + others[0], 0
    expected = len(caps) + others[1]  # each sequence's own token, and the others' tokens
    step, overhead = costs.draft_step(costs.verify(1)), costs.overhead_s or 0.0

    def rate(tokens: float, n_rows: int, n_drafts: int) -> float:
        return tokens / (costs.verify(n_rows) + n_drafts * step + overhead)

    best = rate(expected, rows, drafts)
    while True:
        pick, pick_rate = -1, best
        for s, (q, cap) in enumerate(zip(acceptance, caps, strict=True)):
            n = depths[s]
            if n >= min(cap, len(q)):
                continue
            candidate = rate(expected + reach[s] * q[n], rows + 1, drafts + 1)
            if candidate > pick_rate:
                pick, pick_rate = s, candidate
        if pick < 0:
            return depths
        reach[pick] *= acceptance[pick][depths[pick]]
        expected += reach[pick]
        depths[pick] += 1
        rows, drafts, best = rows + 1, drafts + 1, pick_rate
