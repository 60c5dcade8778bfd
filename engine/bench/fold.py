"""Folded vs unfolded MTP catch-up, measured side by side in one run.

Folding (engine/speculative/mtp.py) saves one MTP decode per round, but only
where the MTP graph hands back the output row's hidden state for a batch with
several rows and one output; the drafter probes that at load and falls back
to the unfolded call sequence otherwise. This benchmark opens the same model
twice, once asking for folding and once not, runs both interleaved at each
depth, and prints the ratio per repeat's pair, whether the drafts were the
same round by round (they must be), and whether folding was really on (a
graph that does not crop rows turns it off: then the ratio is ~1 by design).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from engine.generation.generator import GenerateRequest, GenerateResult, generate
from engine.generation.session import LoadOptions, Session
from engine.speculative.settings import SpeculativeSettings


@dataclass
class FoldRow:
    n_max: int
    folded_tps: list[float] = field(default_factory=list)
    unfolded_tps: list[float] = field(default_factory=list)
    ratio: list[float] = field(default_factory=list)  # folded / unfolded, per repeat
    mtp_decodes_per_round: tuple[float, float] = (0.0, 0.0)
    catch_up_ms: tuple[float, float] = (0.0, 0.0)
    draft_ms: tuple[float, float] = (0.0, 0.0)
    same_drafts: bool = True
    acceptance: float = 0.0


def _run(session: Session, prompt: str, n_tokens: int, n_max: int) -> GenerateResult:
    request = GenerateRequest(prompt=prompt, max_tokens=n_tokens, speculative=SpeculativeSettings("mtp", n_max),
                              record_drafts=True)
    return generate(session, request)


def _per_round_ms(result: GenerateResult, phase: str) -> float:
    return 1000 * result.stats.phase_seconds[phase] / max(1, result.stats.rounds)


def compare(path: str, prompt: str, n_tokens: int, depths: list[int], repeats: int, threads: int,
            sidecar: str | None = None) -> tuple[bool, list[FoldRow]]:
    """Returns (folding was on in the folded session, one row per depth)."""
    folded = Session(LoadOptions(path=path, sidecar=sidecar, n_ctx=2048, n_threads=threads, fold=True))
    unfolded = Session(LoadOptions(path=path, sidecar=sidecar, n_ctx=2048, n_threads=threads, fold=False))
    try:
        if folded.mtp_drafter is None or unfolded.mtp_drafter is None:
            raise SystemExit(f"error: {path} has no MTP head the engine can use; nothing to fold.")
        folds = folded.mtp_drafter.fold
        rows = {n: FoldRow(n) for n in depths}
        for session in (folded, unfolded):  # warm-up: the first decodes pay for page faults
            _run(session, prompt, 16, depths[0])
        for rep in range(repeats):
            for n in depths:
                pair = (folded, unfolded) if rep % 2 == 0 else (unfolded, folded)
                got = {id(s): _run(s, prompt, n_tokens, n) for s in pair}
                a, b = got[id(folded)], got[id(unfolded)]
                row = rows[n]
                ta, tb = a.stats.decode_tps() or 0.0, b.stats.decode_tps() or 0.0
                row.folded_tps.append(ta)
                row.unfolded_tps.append(tb)
                row.ratio.append(ta / tb if tb else 0.0)
                row.same_drafts &= a.drafts_per_round == b.drafts_per_round and a.tokens == b.tokens
                row.catch_up_ms = (_per_round_ms(a, "catch_up"), _per_round_ms(b, "catch_up"))
                row.draft_ms = (_per_round_ms(a, "draft"), _per_round_ms(b, "draft"))
                row.acceptance = a.stats.acceptance_rate or 0.0
        return folds, [rows[n] for n in depths]
    finally:
        folded.close()
        unfolded.close()


def format_table(rows: list[FoldRow]) -> str:
    head = (f"{'n_max':>5} {'folded tok/s':>12} {'unfolded':>9} {'folded/unfolded':>15} {'accept':>7} "
            f"{'draft ms f/u':>13} {'catch-up ms f/u':>16}  same drafts")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r.n_max:5d} {statistics.median(r.folded_tps):12.1f} {statistics.median(r.unfolded_tps):9.1f} "
            f"{statistics.median(r.ratio):14.3f}x {100 * r.acceptance:6.0f}% "
            f"{r.draft_ms[0]:6.1f}/{r.draft_ms[1]:<6.1f} {r.catch_up_ms[0]:7.1f}/{r.catch_up_ms[1]:<8.1f}  "
            f"{'yes' if r.same_drafts else 'NO'}"
        )
    lines.append("ratios per repeat: " + "; ".join(
        f"n_max {r.n_max}: " + " ".join(f"{x:.3f}" for x in r.ratio) for r in rows))
    return "\n".join(lines)
