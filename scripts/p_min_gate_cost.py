"""The p_min gate's cost per draft step at real vocabulary sizes: the partition of the whole row
(``top_probability``, what the gate did before) against the two-largest-logits decision
(``passes_p_min``, what it does now), on random rows with one token spiked above the rest.

    .venv/bin/python scripts/p_min_gate_cost.py [--p-min 0.5]

Prints microseconds per row for each vocabulary size and spike (the top token's probability).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from engine.speculative.mtp import passes_p_min, top_probability


def per_row_us(work, repeats: int = 300) -> float:
    work()
    t0 = time.perf_counter()
    for _ in range(repeats):
        work()
    return (time.perf_counter() - t0) / repeats * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--p-min", type=float, default=0.5)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print(f"{'vocabulary':>10} {'p(top)':>7} {'partition us':>13} {'two largest us':>15}")
    for n_vocab in (4096, 151_936, 262_144):
        for spike in (0.0, 4.0, 10.0):
            row = (rng.standard_normal(n_vocab) * 2).astype(np.float32)
            row[rng.integers(n_vocab)] = row.max() + spike
            before = per_row_us(lambda row=row: top_probability(row) >= args.p_min)
            now = per_row_us(lambda row=row: passes_p_min(row, args.p_min))
            print(f"{n_vocab:>10,} {top_probability(row):7.2f} {before:13.0f} {now:15.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
