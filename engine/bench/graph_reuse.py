"""How often llama.cpp rebuilds a compute graph during speculative decoding.

llama.cpp reuses only the graph of the previous decode, and only when the
new one has the same shape. A speculative round alternates shapes: the
target verifies 1 + k rows (k varying under adaptive depth), and the MTP
context decodes a catch-up batch, then one draft row per position. Every
change of shape is a graph build on the host, and on CUDA it also keeps
CUDA graphs from being captured (they need two unchanged calls). This
counts, per context, graphs run against graphs reused, so a fix (a graph
kept per verify size, bucketed verify sizes) can be judged by numbers:

    mtp-studio bench-policies graph-reuse [--arch qwen35] [--gpu-layers 999]
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from engine.generation.generator import GenerateRequest, generate
from engine.generation.session import Session
from engine.runtime import Context
from engine.speculative.settings import SpeculativeSettings


@dataclass
class GraphCounts:
    label: str
    target_graphs: int = 0
    target_reused: int = 0
    draft_graphs: int = 0
    draft_reused: int = 0
    rounds: int = 0
    plain_steps: int = 0

    @staticmethod
    def share(reused: int, graphs: int) -> float:
        return reused / graphs if graphs else 0.0


def _counters(ctx: Context | None) -> tuple[int, int]:
    return (ctx.graphs, ctx.graphs_reused()) if ctx is not None else (0, 0)


def measure(session: Session, prompt: str, n_tokens: int, label: str, spec: SpeculativeSettings) -> GraphCounts:
    """Graphs run and reused by the target and the MTP context during one generation of ``n_tokens``."""
    session.prepare(mtp=spec.enabled)  # contexts are (re)made here, not inside the counted span
    target, draft = session.target, session.mtp_drafter.ctx if session.mtp_drafter else None
    t0, d0 = _counters(target), _counters(draft)
    result = generate(session, GenerateRequest(prompt=prompt, max_tokens=n_tokens, speculative=spec))
    assert session.target is target, "the target context was recreated mid-generation"
    t1, d1 = _counters(target), _counters(draft)
    return GraphCounts(label, t1[0] - t0[0], t1[1] - t0[1], d1[0] - d0[0], d1[1] - d0[1],
                       result.stats.rounds, result.stats.plain_steps)


def table(rows: list[GraphCounts]) -> str:
    lines = [f"{'setting':<16} {'steps':>6} {'target graphs':>13} {'reused':>7} {'share':>6}   "
             f"{'MTP graphs':>10} {'reused':>7} {'share':>6}"]
    for r in rows:
        lines.append(f"{r.label:<16} {r.rounds + r.plain_steps:6d} {r.target_graphs:13d} {r.target_reused:7d} "
                     f"{GraphCounts.share(r.target_reused, r.target_graphs):6.0%}   {r.draft_graphs:10d} "
                     f"{r.draft_reused:7d} {GraphCounts.share(r.draft_reused, r.draft_graphs):6.0%}")
    return "\n".join(lines)


def compare(session: Session, prompt: str, n_tokens: int, settings: list[tuple[str, SpeculativeSettings]],
            say: Callable[[str], None]) -> list[GraphCounts]:
    rows = [measure(session, prompt, n_tokens, label, spec) for label, spec in settings]
    say(table(rows))
    return rows
