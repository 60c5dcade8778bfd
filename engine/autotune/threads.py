"""Thread counts for this machine, measured: the target's decode/verify
threads, and the MTP draft context's.

Why measure: ggml's worker threads meet at a barrier after every operation,
so one thread that shares its core with another program makes every other
thread wait for it — with one of two cores busy, a tiny model decoded at
51 tok/s on 2 threads and 6,852 tok/s on 1 (issue 14). How much that costs
depends on the machine and on what else runs, so autotune times it.

Rule (the same as the settings search): the current count is the baseline;
another count wins only when its per-prompt speed ratio's one-sided 95 %
lower bound is above 1.0, and then the fastest such count. A one-row draft
decode has little to split, so the draft context is timed on its own with
the chosen speculative setting.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.autotune.paired import paired_replies
from engine.autotune.search import RatioStats
from engine.generation.session import Session
from engine.speculative.settings import SPECULATION_OFF, SpeculativeSettings


def options(cores: int | None = None) -> list[int]:
    """Thread counts worth timing: 1, every core but one, every core (at most 8), and the halfway point."""
    n = max(1, min(cores or os.cpu_count() or 1, 8))
    return sorted({1, max(1, n - 1), n, max(1, n // 2)})


@dataclass
class ThreadMeasurement(RatioStats):
    threads: int
    tps: list[float] = field(default_factory=list)
    ratios: list[float] = field(default_factory=list)  # vs the baseline on the same prompt


@dataclass
class ThreadChoice:
    threads: int
    baseline: int
    measurements: list[ThreadMeasurement]
    what: str  # "decode" | "draft"

    @property
    def reason(self) -> str:
        won = next(m for m in self.measurements if m.threads == self.threads)
        if self.threads == self.baseline:
            return f"{self.what} threads stay {self.baseline}: no other count was faster beyond the noise."
        return (f"{self.what} threads {self.threads}: {won.mean_ratio:.2f}x the speed with {self.baseline} "
                f"(at least {won.lower_bound:.2f}x with 95% confidence).")

    def table(self) -> str:
        lines = [f"{self.what + ' threads':>14} {'tok/s':>7} {'vs ' + str(self.baseline):>7} {'low 95%':>8}"]
        for m in self.measurements:
            mark = " <- chosen" if m.threads == self.threads else ""
            lines.append(f"{m.threads:14d} {statistics.fmean(m.tps) if m.tps else 0:7.1f} {m.mean_ratio:6.2f}x "
                         f"{m.lower_bound:7.2f}x{mark}")
        return "\n".join(lines)


def _set(session: Session, what: str, n: int) -> None:
    if what == "draft":
        session.set_threads(session.options.n_threads, n)
    else:
        session.set_threads(n, session.options.n_threads_draft)


def choose(session: Session, prompts: list[list[dict[str, str]]], counts: list[int], *, what: str = "decode",
           spec: SpeculativeSettings = SPECULATION_OFF, max_tokens: int = 48, baseline: int | None = None,
           progress: Callable[[str], None] | None = None) -> ThreadChoice:
    """Time ``counts`` threads for the target (``what="decode"``) or the draft context (``"draft"``)
    on ``prompts`` with ``spec``; leave the winner set."""
    if what == "draft" and session.mtp_drafter is None:
        raise ValueError("no draft context to time: the model has no MTP head")
    current = (session.options.n_threads_draft or session.options.n_threads) if what == "draft" \
        else session.options.n_threads
    base = baseline or current
    counts = sorted({base, *counts})
    rows = {n: ThreadMeasurement(n) for n in counts}
    for replies in paired_replies(session, prompts, counts, lambda n: _set(session, what, n), spec,
                                  max_tokens=max_tokens, label=lambda n: f"{what} threads {n}", progress=progress):
        tps = {n: r.stats.decode_tps() or 0.0 for n, r in replies.items()}
        for n in counts:
            rows[n].tps.append(tps[n])
            rows[n].ratios.append(tps[n] / tps[base] if tps[base] else 1.0)
    best = decide(list(rows.values()), base)
    _set(session, what, best)
    return ThreadChoice(best, base, list(rows.values()), what)


def decide(rows: list[ThreadMeasurement], baseline: int) -> int:
    """The fastest count whose lower bound against ``baseline`` is above 1.0; else ``baseline``."""
    winners = [m for m in rows if m.threads != baseline and m.lower_bound > 1.0]
    return max(winners, key=lambda m: m.mean_ratio).threads if winners else baseline
