"""The speculative setting for N sequences decoded together, measured.

Why measure: one sequence's decode is bound by memory bandwidth, so the extra
verify rows of a draft cost little; with N sequences in one batch the target
does N times the arithmetic per weight read, and past some N the drafts'
rows are no longer free (users report the MTP gain gone by ``--parallel 4``).
Where that happens depends on the machine and the model.

How: for each N, rounds of N different prompts are run together
(:func:`engine.generation.parallel.generate_together`) with "off" and with
each candidate; a round's figure is the total generated tokens over the
wall-clock time of the whole round (prefill included, as a server's clients
see it), and the candidate's ratio to "off" on the same prompts and seeds is
one paired sample. The order of the settings alternates between rounds so
that drift (a warming CPU, another program) does not favour one. The rule is
the settings search's (search.py): the fastest candidate whose one-sided 95 %
lower bound on the mean ratio is above 1.0, else "off".

Only speed is measured here: that every sequence's greedy output is what it
would be alone is the parallel generator's own tested property
(tests/engine/test_parallel.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.autotune.search import RatioStats, seeded
from engine.generation.generator import GenerateRequest
from engine.generation.parallel import generate_together
from engine.generation.session import Session
from engine.sampling import GREEDY, SamplingParams
from engine.speculative.settings import ADAPTIVE, MTP, SPECULATION_OFF, SpeculativeSettings

CANDIDATES_FROM_ALONE = 3  # the single-sequence search's fastest correct settings tried at every N


@dataclass
class ConcurrencyMeasurement(RatioStats):
    """One setting at one concurrency: total tokens/s per round and its ratio to "off" on that round."""

    setting: SpeculativeSettings
    tps: list[float] = field(default_factory=list)
    ratios: list[float] = field(default_factory=list)
    drafted: int = 0  # over every sequence and round
    accepted: int = 0

    @property
    def mean_tps(self) -> float:
        return sum(self.tps) / len(self.tps) if self.tps else 0.0

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None


@dataclass
class ConcurrencyResult:
    """What was measured with ``n`` sequences at once, and the choice."""

    n: int
    best: SpeculativeSettings
    measurements: list[ConcurrencyMeasurement]
    reason: str

    @property
    def speedup(self) -> float:
        return next((m.mean_ratio for m in self.measurements if m.setting == self.best), 1.0)

    def table(self) -> str:
        head = (f"{'N=' + str(self.n) + ' setting':<28} {'total tok/s':>11} {'vs off':>7} {'low 95%':>8} "
                f"{'accept':>7} {'rounds':>6}")
        lines = [head, "-" * len(head)]
        for m in sorted(self.measurements, key=lambda m: -m.mean_ratio):
            mark = " <- chosen" if m.setting == self.best else ""
            acc = f"{100 * m.acceptance:.0f}%" if m.acceptance is not None else "-"
            lines.append(f"{m.setting.label:<28} {m.mean_tps:11.1f} {m.mean_ratio:6.2f}x {m.lower_bound:7.2f}x "
                         f"{acc:>7} {len(m.tps):6d}{mark}")
        return "\n".join(lines)


def candidates(finalists: list[SpeculativeSettings], deepest: int) -> list[SpeculativeSettings]:
    """"off", the single-sequence search's fastest correct settings, and MTP with adaptive depth up to
    ``deepest`` (0: no head): under concurrency it chooses every sequence's depth for the whole batch."""
    out = [SPECULATION_OFF, *[s for s in finalists if s.enabled][:CANDIDATES_FROM_ALONE]]
    if deepest >= 2:
        out.append(SpeculativeSettings(MTP, deepest, depth=ADAPTIVE))
    return list(dict.fromkeys(out))


def measure(session: Session, prompts: list[list[dict[str, str]]], n: int, settings: list[SpeculativeSettings], *,
            rounds: int = 3, max_tokens: int = 48, sampling: SamplingParams = GREEDY,
            progress: Callable[[str], None] | None = None) -> ConcurrencyResult:
    """Time ``settings`` (with "off") on ``rounds`` rounds of ``n`` prompts run together, and decide.

    Raises:
        ValueError: ``session`` holds fewer than ``n`` sequences (load it with ``LoadOptions(parallel=n)``).
    """
    if session.n_seq < n:
        raise ValueError(f"{n} sequences at once need a session loaded with parallel >= {n}, not {session.n_seq}")
    settings = list(dict.fromkeys([SPECULATION_OFF, *settings]))
    rows = {s: ConcurrencyMeasurement(s) for s in settings}
    for r in range(rounds):
        picks = [(r * n + i) % len(prompts) for i in range(n)]
        order = settings if r % 2 == 0 else list(reversed(settings))
        tps: dict[SpeculativeSettings, float] = {}
        for s in order:
            requests = [GenerateRequest(messages=tuple(prompts[p]), max_tokens=max_tokens, speculative=s,
                                        sampling=seeded(sampling, r * n + i)) for i, p in enumerate(picks)]
            tps[s] = _total_tps(session, requests, rows[s])
            if progress:
                progress(f"{n} at once, {s.label}: {tps[s]:.1f} tok/s in all")
        for s in settings:
            rows[s].tps.append(tps[s])
            rows[s].ratios.append(tps[s] / tps[SPECULATION_OFF] if tps[SPECULATION_OFF] else 1.0)
    best, reason = decide(list(rows.values()), n)
    return ConcurrencyResult(n, best, list(rows.values()), reason)


def _total_tps(session: Session, requests: list[GenerateRequest], row: ConcurrencyMeasurement) -> float:
    """Generated tokens of all ``requests`` run together over the wall-clock time; counts drafts into ``row``."""
    start = time.perf_counter()
    results = generate_together(session, requests)
    elapsed = time.perf_counter() - start
    row.drafted += sum(r.stats.drafted for r in results)
    row.accepted += sum(r.stats.accepted for r in results)
    return sum(len(r.tokens) for r in results) / elapsed if elapsed > 0 else 0.0


def decide(rows: list[ConcurrencyMeasurement], n: int) -> tuple[SpeculativeSettings, str]:
    """The fastest setting whose lower bound on the ratio to "off" is above 1.0, else "off"; and why."""
    spec = [m for m in rows if m.setting.enabled]
    winners = [m for m in spec if m.lower_bound > 1.0]
    if winners:
        best = max(winners, key=lambda m: m.mean_ratio)
        return best.setting, (f"with {n} at once, {best.setting.label} gives {best.mean_ratio:.2f}x the total "
                              f"speed of no speculation (at least {best.lower_bound:.2f}x with 95% confidence "
                              f"over {len(best.ratios)} rounds).")
    top = max(spec, key=lambda m: m.mean_ratio, default=None)
    if top is None:
        return SPECULATION_OFF, f"with {n} at once: nothing to try; speculation stays off."
    return SPECULATION_OFF, (f"with {n} at once, no setting was faster beyond the noise (best: {top.setting.label} "
                             f"at {top.mean_ratio:.2f}x, lower bound {top.lower_bound:.2f}x); speculation stays off.")
