"""Benchmarks of the drafting policies, each measured side by side in one run:

- ``categories``: per autotune-suite category, plain vs every fixed depth vs
  adaptive depth (and n-gram / composition where the engine has them);
- ``driver``: ours with adaptive depth vs llama.cpp's C++ driver
  (``llama-speculative-simple``) at each fixed depth, on the same GGUF and
  prompt; the driver's best depth is the anchor;
- ``threads``: decode speed by thread count, on a quiet machine and with
  busy processes pinned to cores (what ``default_threads`` is chosen from);
- ``verify-cost``: the time of a verify batch of k rows against a one-token
  decode, per weight type (the adaptive policy's cost model in numbers);
- ``probes``: adaptive depth with shadow probes vs verified ones.

Figures that matter are ratios within one repeat; repeats are interleaved.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from engine.errors import ContextError
from engine.generation import identity
from engine.generation.generator import GenerateRequest, GenerateResult, generate, render_prompt
from engine.generation.session import Session
from engine.runtime import Batch
from engine.speculative.depth import DepthPolicy
from engine.speculative.rollback import PARTIAL_ONLY
from engine.speculative.settings import SPECULATION_OFF, SpeculativeSettings

Say = Callable[[str], None]


def _run(session: Session, messages: list[dict[str, str]] | None, prompt: str | None, n_tokens: int,
         spec: SpeculativeSettings, hold: bool = False, policy: DepthPolicy | None = None) -> GenerateResult:
    return generate(session, GenerateRequest(
        prompt=prompt, messages=tuple(messages) if messages else None, max_tokens=n_tokens, speculative=spec,
        hold_last_prompt_token=hold), policy=policy)


def _tps(result: GenerateResult) -> float:
    return result.stats.decode_tps() or 0.0


@dataclass
class Cell:
    tps: list[float] = field(default_factory=list)
    ratio: list[float] = field(default_factory=list)  # vs plain in the same repeat
    verdict: str = "identical"  # the worst over repeats (engine/generation/identity.py)

    @property
    def median_ratio(self) -> float:
        return statistics.median(self.ratio) if self.ratio else 0.0


def categories(session: Session, prompts: list[tuple[str, str]], settings: list[SpeculativeSettings],
               n_tokens: int, repeats: int, say: Say) -> dict[str, dict[str, Cell]]:
    """Per category: each setting's speed relative to plain on that prompt, interleaved."""
    table: dict[str, dict[str, Cell]] = {}
    labels = [s.label for s in settings]
    say(f"{'category':<17} {'plain tok/s':>11} " + " ".join(f"{lab:>22}" for lab in labels)
        + "  best fixed  adaptive/best")
    _run(session, None, " warm up", 16, SPECULATION_OFF)
    noise = identity.measure_noise(session)
    severity = {identity.IDENTICAL: 0, identity.NEAR_TIE: 1, identity.DEFECT: 2}
    for category, text in prompts:
        messages = [{"role": "user", "content": text}]
        prompt_tokens = render_prompt(session, GenerateRequest(messages=tuple(messages)))[0]
        margins = generate(session, GenerateRequest(messages=tuple(messages), max_tokens=n_tokens,
                                                    record_margins=True)).margins
        cells = {"off": Cell(), **{lab: Cell() for lab in labels}}
        for rep in range(repeats):
            order = [SPECULATION_OFF, *settings]
            if rep % 2:
                order.reverse()
            results = {s.label: _run(session, messages, None, n_tokens, s) for s in order}
            plain = results["off"]
            for lab, res in results.items():
                cells[lab].tps.append(_tps(res))
                cells[lab].ratio.append(_tps(res) / _tps(plain) if _tps(plain) else 0.0)
                kind = identity.classify_along(session, prompt_tokens, plain.tokens, margins, res.tokens, noise).kind
                if severity[kind] > severity[cells[lab].verdict]:
                    cells[lab].verdict = kind
        table[category] = cells
        fixed = {lab: c for lab, c in cells.items() if lab.startswith("mtp n_max")}
        best = max(fixed, key=lambda lab: fixed[lab].median_ratio, default=None)
        adaptive = next((lab for lab in labels if "adaptive" in lab), None)
        tail = ""
        if best and adaptive:
            anchor = fixed[best].median_ratio
            tail = f"  {best.split('=')[-1]:>10} {cells[adaptive].median_ratio / anchor if anchor else 0:13.3f}x"
        marks = " ".join(f"{cells[lab].median_ratio:21.2f}x" + _MARK[cells[lab].verdict] for lab in labels)
        say(f"{category:<17} {statistics.median(cells['off'].tps):11.1f} {marks}{tail}")
    return table


# after a ratio: nothing when the output is plain's, "~" when it parts at a near tie (within the
# measured batch-vs-single noise, still a correct greedy output), "!" when it parts beyond it (a defect)
_MARK = {"identical": " ", "near_tie": "~", "defect": "!"}


def versus_driver(session: Session, binary: Path, model: Path, prompt: str, n_tokens: int, depths: list[int],
                  adaptive_max: int, repeats: int, threads: int, say: Say) -> None:
    """Ours with adaptive depth vs the C++ driver at each fixed depth, interleaved; the
    ratio is against the driver's best depth in the same repeat."""
    from engine.bench import reference
    from engine.speculative.settings import mtp

    ours_spec = mtp(adaptive_max, depth="adaptive")
    ours_fixed = {n: mtp(n) for n in depths}
    n_ctx = session.options.n_ctx
    _run(session, None, prompt, 16, ours_spec, hold=True)
    ours: list[float] = []
    fixed: dict[int, list[float]] = {n: [] for n in depths}
    theirs: dict[int, list[float]] = {n: [] for n in depths}
    ratios: list[float] = []
    for rep in range(repeats):
        driver = {}
        for n in (depths if rep % 2 == 0 else list(reversed(depths))):
            driver[n] = reference.run_driver(binary, model, prompt, n_tokens, n, threads, None, n_ctx,
                                             verbose=False).tps
            theirs[n].append(driver[n])
            fixed[n].append(_decode_span_tps(_run(session, None, prompt, n_tokens, ours_fixed[n], hold=True)))
        mine = _decode_span_tps(_run(session, None, prompt, n_tokens, ours_spec, hold=True))
        ours.append(mine)
        ratios.append(mine / max(driver.values()))
    say(f"{'n_max':>5} {'llama.cpp tok/s':>15} {'ours fixed':>10} {'ours/llama.cpp':>14}")
    for n in depths:
        t, f = statistics.median(theirs[n]), statistics.median(fixed[n])
        say(f"{n:5d} {t:15.1f} {f:10.1f} {f / t if t else 0:13.3f}x")
    best = max(depths, key=lambda n: statistics.median(theirs[n]))
    say(f"ours adaptive (n_max<={adaptive_max}): {statistics.median(ours):.1f} tok/s; llama.cpp's best fixed depth "
        f"is n_max={best} at {statistics.median(theirs[best]):.1f} tok/s; ours adaptive / llama.cpp best = "
        f"{statistics.median(ratios):.3f}x (median over {repeats} repeats, each against that repeat's best)")


def _decode_span_tps(result: GenerateResult) -> float:
    """Tokens per second from the first token on, as the driver counts (``decoded N tokens in S s``)."""
    s = result.stats
    span = (s.t_end or 0.0) - (s.t_first_token or 0.0)
    return s.generated_tokens / span if span > 0 else 0.0


# -- probes -------------------------------------------------------------------
def probes(session: Session, prompts: list[tuple[str, str]], n_max: int, n_tokens: int, repeats: int,
           say: Say) -> None:
    """Adaptive depth with shadow probes vs verified probes (engine/speculative/adaptive/), side by
    side on one loaded model, interleaved; each kind keeps its own policy between its replies, as a
    chat does. Prints each kind's speed relative to plain per prompt, and shadow / verified."""
    from engine.speculative.adaptive import AdaptiveDepth, AdaptiveParams
    from engine.speculative.settings import mtp

    drafter = session.mtp_drafter
    if drafter is None or not drafter.shadow_probes:
        say("(this model has no MTP drafter that can shadow-probe)")
        return
    spec = mtp(n_max, depth="adaptive")
    policies = {"shadow": AdaptiveDepth(spec.n_max),
                "verified": AdaptiveDepth(spec.n_max, AdaptiveParams(shadow_probes=False))}

    def run(kind: str, messages: list[dict[str, str]], n: int) -> float:
        if kind == "off":
            return _tps(_run(session, messages, None, n, SPECULATION_OFF))
        return _tps(_run(session, messages, None, n, spec, policy=policies[kind]))

    kinds = ["off", "shadow", "verified"]
    chats = [(category, [{"role": "user", "content": text}]) for category, text in prompts]
    for kind in kinds:  # each policy learns the model before anything is timed
        for _, messages in chats:
            run(kind, messages, n_tokens // 2)
    tps: dict[tuple[str, str], list[float]] = {(k, c): [] for k in kinds for c, _ in chats}
    pairs: list[float] = []
    for rep in range(repeats):
        for category, messages in chats:
            got = {k: run(k, messages, n_tokens) for k in (kinds if rep % 2 == 0 else kinds[::-1])}
            for k, v in got.items():
                tps[(k, category)].append(v)
            pairs.append(got["shadow"] / got["verified"] if got["verified"] else 0.0)
    say(f"{'category':<17} {'plain tok/s':>11} {'shadow probes':>14} {'verified probes':>16}")
    for category, _ in chats:
        plain = statistics.median(tps[("off", category)])
        cells = " ".join(f"{statistics.median(tps[(k, category)]) / plain:15.3f}x" for k in kinds[1:])
        say(f"{category:<17} {plain:11.1f} {cells}")
    say(f"shadow / verified, per pair: median {statistics.median(pairs):.3f}x over {len(pairs)} pairs")


# -- threads ------------------------------------------------------------------
def busy(cores: list[int]) -> list[subprocess.Popen[bytes]]:
    """One process spinning on each of ``cores`` (pinned): another program using a core."""
    code = "import os, sys; os.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True: pass"
    return [subprocess.Popen([sys.executable, "-c", code, str(c)]) for c in cores]


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        p.kill()
        p.wait()


def set_threads(session: Session, n: int, n_draft: int | None = None) -> None:
    session.set_threads(n, n_draft or 0)


def thread_sweep(session: Session, prompt: str, n_tokens: int, options: list[int], repeats: int,
                 spec: SpeculativeSettings = SPECULATION_OFF, draft_options: list[int] | None = None
                 ) -> dict[tuple[int, int], list[float]]:
    """Decode tok/s per (threads, draft threads), interleaved over ``repeats``."""
    combos = [(t, d) for t in options for d in (draft_options or [0])]
    out: dict[tuple[int, int], list[float]] = {c: [] for c in combos}
    set_threads(session, options[0])
    _run(session, None, prompt, 8, spec)
    for rep in range(repeats):
        for t, d in (combos if rep % 2 == 0 else list(reversed(combos))):
            set_threads(session, t, d or None)
            out[(t, d)].append(_tps(_run(session, None, prompt, n_tokens, spec)))
    return out


def load_state() -> str:
    """What else runs: the load average, and whether a compiler is running."""
    compiling = subprocess.run(["pgrep", "-c", "cc1plus"], capture_output=True, text=True).stdout.strip() or "0"
    return f"load average {os.getloadavg()[0]:.2f}, {compiling} compiler process(es) running"


# -- verify cost ------------------------------------------------------------------
def verify_costs(session: Session, rows: list[int], repeats: int = 20, context: int = 64) -> dict[int, float]:
    """Seconds of one target decode of ``k`` rows (all outputs, as a verify batch) after ``context``
    tokens, median over ``repeats``; the rows are removed again after each decode.

    A hybrid target cannot drop a whole batch by ``seq_rm`` (no snapshot plane holds the state
    before it; packaging/patches/0006 refuses it), so its recurrent state is restored from a
    checkpoint first, untimed, as the engine's checkpoint rollback does.
    """
    target = session.target
    batch = Batch(max(target.n_batch, max(rows)))
    target.clear()
    batch.clear()
    for p in range(context):
        batch.add(1 + p % 50, p, p == context - 1)
    target.decode(batch)
    checkpoint = target.state_save(flags=PARTIAL_ONLY) if session.is_hybrid else None
    out: dict[int, float] = {}
    times: dict[int, list[float]] = {k: [] for k in rows}
    for rep in range(repeats + 2):
        for k in rows:
            batch.clear()
            for j in range(k):
                batch.add(7 + j, context + j, True)
            t0 = time.perf_counter()
            target.decode(batch)
            dt = time.perf_counter() - t0
            if checkpoint is not None:
                target.state_restore(checkpoint, flags=PARTIAL_ONLY)
            if not target.seq_rm(context, -1):
                raise ContextError(f"the {k} timed rows could not be removed again")
            if rep >= 2:  # two warm-up passes
                times[k].append(dt)
    for k in rows:
        out[k] = statistics.median(times[k])
    target.clear()
    return out
