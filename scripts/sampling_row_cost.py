"""What one row of p (the target's processed distribution) and q (a draft's) costs at real vocabularies,
through every stage of the chain (before) and through top-k's / min-p's candidates only (now).

    .venv/bin/python scripts/sampling_row_cost.py

Rows are random logits with a few tokens lifted above the rest (a confident head), 30 tokens in the
penalties' history; the median of 200 rows each. Rejection-sampling verification computes p for every
verified row and q for every draft (docs/mtp.md, "Probabilistic draft acceptance").
"""

from __future__ import annotations

import statistics
import time
from dataclasses import replace

import numpy as np

from engine.runtime.distribution import TokenRow, candidates
from engine.runtime.sampler import Sampler
from engine.sampling import PRESETS


def _median_ms(fn, rows: list[np.ndarray]) -> float:
    times = []
    for row in rows:
        t = time.perf_counter()
        fn(row)
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def main() -> None:
    rng = np.random.default_rng(0)
    print("| vocabulary | preset | p before | p now | q before | q now |")
    print("|---:|---|---:|---:|---:|---:|")
    for n_vocab in (151_936, 262_144):
        rows = []
        for _ in range(200):
            row = (rng.standard_normal(n_vocab) * 2.0).astype(np.float32)
            row[rng.integers(0, n_vocab, 5)] += 8.0
            rows.append(row)
        for name in ("balanced", "creative"):
            p0, p1, q0, q1 = _measure(name, n_vocab, rows, rng)
            print(f"| {n_vocab:,} | {name} | {p0:.2f} ms | {p1:.2f} ms | {q0:.2f} ms | {q1:.2f} ms |")


def _measure(name: str, n_vocab: int, rows: list[np.ndarray], rng: np.random.Generator) -> tuple[float, ...]:
    """p and q of one preset: every entry through the stages, then the candidates only."""
    sampler = Sampler(replace(PRESETS[name], seed=1), n_vocab, n_ctx=512)
    sampler.accept_prompt([int(t) for t in rng.integers(0, n_vocab, 30)])
    drafts = sampler.draft_sampler()
    drafts.start()
    try:
        whole = TokenRow(sampler._lib, n_vocab)
        q_stages = [drafts._clone if s is sampler._penalties else s for s in drafts._stages]
        return (_median_ms(lambda row: whole.probabilities(sampler._stages, row), rows),
                _median_ms(sampler.distribution, rows),
                _median_ms(lambda row: whole.probabilities(q_stages, row), rows),
                _median_ms(lambda row: drafts._row.probabilities(
                    q_stages, row, candidates(row, drafts._cuts, sorted(drafts._adjusted))), rows))
    finally:
        drafts.end()
        sampler.close()


if __name__ == "__main__":
    main()
