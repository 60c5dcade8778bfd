"""Plain vs MTP, measured side by side in one run, and the speedup the
measured unit costs predict.

Every configuration runs in the same process on the same loaded model, in
interleaved order, several times; the figures that matter are ratios within
one repeat (the machine is noisy, absolute tok/s drift).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from engine.generation.generator import GenerateRequest, GenerateResult, generate
from engine.generation.session import Session
from engine.speculative.settings import SpeculativeSettings


@dataclass
class Row:
    label: str
    n_max: int  # 0 = plain
    tps: list[float] = field(default_factory=list)  # decode tok/s per repeat
    speedup: list[float] = field(default_factory=list)  # vs plain in the same repeat
    acceptance: float | None = None
    mean_len: float | None = None
    per_pos: list[float] = field(default_factory=list)
    ideal: list[float] = field(default_factory=list)
    identical: bool = True
    verify_ms: float = 0.0  # per round (or per token for plain)
    draft_ms: float = 0.0
    catch_up_ms: float = 0.0
    host_ms: float = 0.0

    @property
    def median_tps(self) -> float:
        return statistics.median(self.tps) if self.tps else 0.0

    @property
    def median_speedup(self) -> float:
        return statistics.median(self.speedup) if self.speedup else 1.0

    @property
    def median_ideal(self) -> float:
        return statistics.median(self.ideal) if self.ideal else 1.0


def _run(session: Session, prompt: str, n_tokens: int, n_max: int) -> GenerateResult:
    spec = SpeculativeSettings("mtp", n_max) if n_max else SpeculativeSettings()
    return generate(session, GenerateRequest(prompt=prompt, max_tokens=n_tokens, speculative=spec))


def ideal_speedup(result: GenerateResult, plain_step_s: float) -> float:
    """Speedup if the host cost nothing: tokens per round over the round's
    device work (verify + drafts + catch-up), against one plain decode."""
    s = result.stats
    steps = s.rounds + s.plain_steps
    if not steps or plain_step_s <= 0:
        return 1.0
    device = s.phase_seconds["verify"] + s.phase_seconds["draft"] + s.phase_seconds["catch_up"]
    tokens = s.generated_tokens - 1  # the first token comes from the prompt
    return (tokens * plain_step_s) / device if device > 0 else 1.0


def compare(session: Session, prompt: str, n_tokens: int, n_max_list: list[int], repeats: int,
            progress: object = None) -> list[Row]:
    """Run plain and each n_max ``repeats`` times, interleaved; return one row each."""
    rows = {0: Row("plain", 0), **{n: Row(f"mtp n_max={n}", n) for n in n_max_list}}
    _run(session, prompt, 16, 0)  # warm-up: first decodes pay for page faults
    if n_max_list:
        _run(session, prompt, 16, n_max_list[0])
    for rep in range(repeats):
        order = [0, *n_max_list] if rep % 2 == 0 else [*reversed(n_max_list), 0]
        results: dict[int, GenerateResult] = {}
        for n in order:
            results[n] = _run(session, prompt, n_tokens, n)
            if callable(progress):
                progress(rep, n, results[n])
        plain = results[0]
        plain_tps = plain.stats.decode_tps() or 0.0
        plain_step = plain.stats.phase_seconds["verify"] / max(1, plain.stats.plain_steps)
        for n, res in results.items():
            row = rows[n]
            tps = res.stats.decode_tps() or 0.0
            row.tps.append(tps)
            row.speedup.append(tps / plain_tps if plain_tps else 0.0)
            row.identical &= res.tokens == plain.tokens
            s = res.stats
            steps = max(1, s.rounds + s.plain_steps)
            row.verify_ms = 1000 * s.phase_seconds["verify"] / steps
            row.draft_ms = 1000 * s.phase_seconds["draft"] / steps
            row.catch_up_ms = 1000 * s.phase_seconds["catch_up"] / steps
            row.host_ms = 1000 * (s.phase_seconds["sampling"] + s.phase_seconds["other"]) / steps
            if n:
                row.acceptance = s.acceptance_rate
                row.mean_len = s.mean_accepted_length
                row.per_pos = s.acceptance_per_pos
                row.ideal.append(ideal_speedup(res, plain_step))
    return [rows[0], *(rows[n] for n in n_max_list)]


def format_table(rows: list[Row]) -> str:
    head = (f"{'setting':<14} {'tok/s':>7} {'speedup':>8} {'ideal':>6} {'achieved':>8} {'accept':>7} "
            f"{'mean len':>8} {'verify':>7} {'draft':>6} {'catchup':>7} {'host':>5} identical  per-position")
    lines = [head, "-" * len(head)]
    for r in rows:
        ideal = r.median_ideal if r.n_max else 1.0
        achieved = r.median_speedup / ideal if ideal else 0.0
        acc = f"{100 * r.acceptance:.0f}%" if r.acceptance is not None else "-"
        mlen = f"{r.mean_len:.2f}" if r.mean_len is not None else "-"
        per = " ".join(f"{x:.2f}" for x in r.per_pos)
        lines.append(
            f"{r.label:<14} {r.median_tps:7.1f} {r.median_speedup:7.2f}x {ideal:5.2f}x {achieved:7.2f} "
            f"{acc:>7} {mlen:>8} {r.verify_ms:6.1f}m {r.draft_ms:5.1f}m {r.catch_up_ms:6.1f}m "
            f"{r.host_ms:4.1f}m {'yes' if r.identical else 'NO':>9}  {per}"
        )
    return "\n".join(lines)
