"""Rejection-sampling verification of sampled drafts (``draft_sampling: "probabilistic"``).

The speculative sampling of Leviathan et al. and Chen et al. (2023), as vLLM's
rejection sampler and llama.cpp's ``--spec-draft-sampling probabilistic`` run
it. The drafter samples each draft token ``d`` from its own processed
distribution ``q``; at that row the target's processed distribution is ``p``:

1. accept ``d`` with probability ``min(1, p(d) / q(d))``;
2. on rejection, the row's token is drawn from the residual ``max(0, p - q)``,
   normalised, and the round ends there;
3. when every draft is accepted, the token after them is drawn from ``p`` at
   the last row (the bonus token).

Each emitted token is then distributed exactly as a sample of ``p`` (the
chance that a row emits ``x`` is ``min(p(x), q(x)) + (1 - Σ min(p, q)) ·
residual(x) = p(x)``), whatever ``q`` is, and a draft is accepted with
probability ``Σ min(p, q)``: more than "sample the target and compare with a
greedy draft" (``p(argmax q)``) wherever ``p`` is spread out, as at high
temperature. The random numbers drawn differ from plain sampling's, so a seeded
reply differs from the plain one: it is an opt-in, off by default.

Pure numpy, no llama.cpp: the decode loop computes ``p`` and ``q`` over the
whole vocabulary (``engine.runtime.distribution``) and calls :func:`judge` and
:func:`draw` row by row, accepting each emitted token into the sampler chain
before the next row's ``p`` is computed (its penalties and grammar see the
tokens in order). :func:`verify` is the same steps over given rows, for tests.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from engine.runtime.distribution import draw


def judge(p: np.ndarray, q: np.ndarray, draft: int, rng: np.random.Generator) -> tuple[bool, int]:
    """Steps 1-2 for one row: (accepted, the row's token: ``draft``, or a draw from the residual).

    Raises:
        ValueError: ``q`` gives ``draft`` no mass (it cannot have been sampled from ``q``).
    """
    q_d = float(q[draft])
    if not q_d > 0.0:
        raise ValueError(f"draft {draft} has no mass in q: it was not sampled from it")
    if rng.random() * q_d < float(p[draft]):  # u < p(d) / q(d), without dividing
        return True, draft
    residual = np.maximum(p - q, 0.0)
    if not float(residual.sum()) > 0.0:  # p <= q everywhere but round-off: p itself
        residual = p
    return False, draw(residual, rng)


def verify(p_rows: Sequence[np.ndarray], q_rows: Sequence[np.ndarray], drafts: Sequence[int],
           rng: np.random.Generator) -> tuple[int, int]:
    """A whole round: (drafts accepted, the token after them).

    ``p_rows`` has one row more than ``drafts`` (the bonus row); ``q_rows`` one per draft.
    """
    if len(p_rows) != len(drafts) + 1 or len(q_rows) != len(drafts):
        raise ValueError("p_rows needs one row per draft and one more; q_rows one per draft")
    for k, d in enumerate(drafts):
        accepted, token = judge(p_rows[k], q_rows[k], d, rng)
        if not accepted:
            return k, token
    return len(drafts), draw(p_rows[len(drafts)], rng)


def acceptance(p: np.ndarray, q: np.ndarray) -> float:
    """The probability that a draft sampled from ``q`` is accepted against ``p``: Σ min(p, q)."""
    return float(np.minimum(p, q).sum())
