"""Find the fastest speculative setting for this machine and model, never
slower than no speculation.

Steps:
1. Candidates: "off"; MTP with n_max 1..(head count for chained heads, else
   up to 8); for n_max >= 2 also a p_min gate; MTP with adaptive depth
   (engine/speculative/adaptive/); n-gram drafting, fixed and adaptive,
   and MTP + n-gram composition (engine/speculative/ngram.py, compose.py) —
   the n-gram ones also on a model without an MTP head.
2. Successive halving: every candidate runs on a few prompts; the slower half
   (by mean speed relative to "off" on the same prompts) is dropped; the rest
   run on more prompts, until the prompt budget is spent. "off" always stays.
   A candidate at under 0.75x "off" is dropped at once, after any prompt:
   noise does not turn that into a win, and slow candidates cost the most time.
3. Decision: per prompt, the ratio setting/off is a paired sample. The
   fastest setting whose lower confidence bound on the mean ratio is above
   1.0 wins; if none clears the noise, the answer is "off".
4. Greedy identity with "off" is checked on every prompt a setting runs,
   with the numbers (engine/generation/identity.py): an output that parts
   from "off" at a near tie (plain's top-2 margin inside the measured
   batch-vs-single noise) is still correct; one that parts beyond it is a
   defect, and that setting can never win.

Speeds are measured with the sampling the chat will use (``sampling``, e.g.
the Balanced preset): acceptance at temperature 0.6 with penalties is not
greedy acceptance. Each prompt gets one seed, the same for "off" and every
setting, so the paired runs sample alike. The identity check stays greedy
(only greedy output is defined exactly): with any other sampling it runs on
greedy runs of its own, untimed.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from engine.generation import identity
from engine.generation.generator import GenerateRequest, GenerateResult, generate, render_prompt
from engine.generation.identity import IdentityVerdict
from engine.generation.session import Session
from engine.sampling import GREEDY, GREEDY_KEY, RANDOM_SEED, SamplingParams, sampling_key
from engine.speculative.settings import (
    ADAPTIVE,
    MAX_DRAFT,
    MTP_NGRAM,
    NGRAM,
    SPECULATION_OFF,
    SpeculativeSettings,
    deepest_draft,
    mtp,
)

Z_LOWER = 1.64  # one-sided 95 % bound on the mean ratio
CLEARLY_WORSE = 0.75  # a mean speed ratio this far below "off" is dropped at once
RARELY_ACCEPTED = 0.05  # below this share of drafts accepted, the verdict blames the head, not the hardware
TUNE_SEED = 1234  # prompt i is sampled with seed TUNE_SEED + i, by "off" and every setting alike


def seeded(sampling: SamplingParams, i: int) -> SamplingParams:
    """``sampling`` with a fixed seed for prompt ``i`` (its own seed kept when it has one)."""
    if sampling.greedy and not sampling.penalised:
        return sampling
    base = TUNE_SEED if sampling.seed == RANDOM_SEED else sampling.seed
    return replace(sampling, seed=(base + i) % RANDOM_SEED)


def setting(n_max: int = 0, p_min: float = 0.0) -> SpeculativeSettings:
    """A candidate: MTP with ``n_max`` and ``p_min``, or "off" for ``n_max`` 0."""
    return mtp(n_max, p_min) if n_max else SPECULATION_OFF


Setting = setting  # the name callers used when candidates had their own type

SpeedFn = Callable[[GenerateResult], float]


def measured_speed(result: GenerateResult) -> float:
    """Decoded tokens per second of wall time: what the tune ranks settings by."""
    return result.stats.decode_tps() or 0.0


def speed_per_row(result: GenerateResult) -> float:
    """Tokens per row the target decoded (a plain step is one row, a round its
    sampled token plus its drafts): the speed on a machine where every row
    costs the same, i.e. fully compute-bound. Not a clock, so the search's
    rules can be checked exactly where wall time would make them a matter of
    load."""
    s = result.stats
    rows = s.plain_steps + s.rounds + s.drafted
    return s.generated_tokens / rows if rows else 0.0


class RatioStats:
    """The mean speed ratio of a candidate over its prompts and its one-sided 95 % lower bound
    (for dataclasses with a ``ratios`` list: a setting here, a thread count in threads.py)."""

    ratios: list[float]

    @property
    def mean_ratio(self) -> float:
        return statistics.fmean(self.ratios) if self.ratios else 1.0

    @property
    def lower_bound(self) -> float:
        if len(self.ratios) < 2:
            return 0.0
        return self.mean_ratio - Z_LOWER * statistics.stdev(self.ratios) / math.sqrt(len(self.ratios))


@dataclass
class Measurement(RatioStats):
    setting: SpeculativeSettings
    tps: list[float] = field(default_factory=list)  # per prompt, as tune's ``speed`` scores it (tokens/s)
    ratios: list[float] = field(default_factory=list)  # per prompt, vs off on that prompt
    drafted: int = 0
    accepted: int = 0
    drafted_per_pos: list[int] = field(default_factory=list)
    accepted_per_pos: list[int] = field(default_factory=list)
    # the worst identity verdict over its prompts: identical < near_tie < defect
    identity: str = identity.IDENTICAL
    dropped_after: int | None = None  # prompts seen when successive halving dropped it

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def per_pos(self) -> list[float]:
        return [a / d if d else 0.0 for a, d in zip(self.accepted_per_pos, self.drafted_per_pos, strict=False)]

    @property
    def mean_tps(self) -> float:
        return statistics.fmean(self.tps) if self.tps else 0.0

    @property
    def identical(self) -> bool:
        """Its output is a correct greedy output on every prompt (near ties included)."""
        return self.identity != identity.DEFECT

    def add(self, result: GenerateResult, off: GenerateResult | None,
            verdict: IdentityVerdict | None = None, speed: SpeedFn = measured_speed) -> None:
        s = result.stats
        tps = speed(result)
        self.tps.append(tps)
        if off is not None:
            off_tps = speed(off)
            self.ratios.append(tps / off_tps if off_tps else 1.0)
        if verdict is not None and _SEVERITY[verdict.kind] > _SEVERITY[self.identity]:
            self.identity = verdict.kind
        self.drafted += s.drafted
        self.accepted += s.accepted
        for i, (d, a) in enumerate(zip(s.drafted_per_pos, s.accepted_per_pos, strict=False)):
            if i >= len(self.drafted_per_pos):
                self.drafted_per_pos.append(0)
                self.accepted_per_pos.append(0)
            self.drafted_per_pos[i] += d
            self.accepted_per_pos[i] += a


@dataclass
class TuneResult:
    best: SpeculativeSettings
    measurements: list[Measurement]
    reason: str
    sampling: str = GREEDY_KEY  # what the speeds were measured with (engine.sampling.sampling_key)

    def finalists(self) -> list[SpeculativeSettings]:
        """Settings still measured at the end whose output was correct, fastest first ("off" not among them)."""
        kept = [m for m in self.measurements if m.setting.enabled and m.dropped_after is None and m.identical]
        return [m.setting for m in sorted(kept, key=lambda m: -m.mean_ratio)]

    def table(self) -> str:
        head = f"{'setting':<28} {'tok/s':>7} {'vs off':>7} {'low 95%':>8} {'accept':>7} {'prompts':>7}  identical"
        lines = [head, "-" * len(head)]
        for m in sorted(self.measurements, key=lambda m: -m.mean_ratio):
            acc = f"{100 * m.acceptance:.0f}%" if m.acceptance is not None else "-"
            mark = " <- chosen" if m.setting == self.best else (" (dropped)" if m.dropped_after else "")
            lines.append(f"{m.setting.label:<28} {m.mean_tps:7.1f} {m.mean_ratio:6.2f}x {m.lower_bound:7.2f}x "
                         f"{acc:>7} {len(m.tps):7d} {IDENTITY_LABELS[m.identity]:>10}{mark}")
        return "\n".join(lines)


NGRAM_DEPTH = 4  # the fixed n-gram candidate's n_max; its adaptive one may go to MAX_DRAFT


def candidates(n_heads: int, chained: bool, p_grid: tuple[float, ...] = (0.5,), *, adaptive: bool = True,
               ngram: bool = True, n_max_cap: int | None = None) -> list[SpeculativeSettings]:
    """Every setting worth timing for a model with ``n_heads`` MTP heads (0: none).

    ``ngram``: also n-gram drafting (any model) and MTP + n-gram (a model
    with a head). ``n_max_cap``: no deeper than this.
    """
    deepest = deepest_draft(n_heads, chained)
    if n_max_cap:
        deepest = min(deepest, n_max_cap)
    out = [SPECULATION_OFF]
    for n in range(1, deepest + 1):
        out.append(mtp(n))
        if n >= 2:
            out += [mtp(n, p) for p in p_grid]
    if adaptive and deepest >= 2:
        out.append(mtp(deepest, depth=ADAPTIVE))
    if ngram:
        top = min(MAX_DRAFT, n_max_cap or MAX_DRAFT)
        out.append(SpeculativeSettings(NGRAM, min(NGRAM_DEPTH, top)))
        if adaptive:
            out.append(SpeculativeSettings(NGRAM, top, depth=ADAPTIVE))
        if deepest:
            out.append(SpeculativeSettings(MTP_NGRAM, min(3, deepest)))
            if adaptive:
                out.append(SpeculativeSettings(MTP_NGRAM, deepest, depth=ADAPTIVE))
    return out


def candidates_for(session: Session, n_max_cap: int | None = None, p_grid: tuple[float, ...] = (0.5,),
                   ngram: bool = True) -> list[SpeculativeSettings]:
    """:func:`candidates` for a loaded model."""
    d = session.mtp_drafter
    return candidates(d.n_heads if d else 0, d.chained if d else False, p_grid, ngram=ngram, n_max_cap=n_max_cap)


ProgressFn = Callable[[dict[str, Any]], None]
_SEVERITY = {identity.IDENTICAL: 0, identity.NEAR_TIE: 1, identity.DEFECT: 2}
IDENTITY_LABELS = {identity.IDENTICAL: "yes", identity.NEAR_TIE: "near tie", identity.DEFECT: "NO"}


def tune(session: Session, prompts: list[list[dict[str, str]]], *, max_tokens: int = 96,
         first_round: int = 2, settings: list[SpeculativeSettings] | None = None, progress: ProgressFn | None = None,
         sampling: SamplingParams = GREEDY, speed: SpeedFn = measured_speed) -> TuneResult:
    """Successive halving over ``settings`` (default: :func:`candidates`) on ``prompts`` (chat messages),
    timed with ``sampling`` (seeded per prompt) and ranked by ``speed`` of each run (tokens/s measured;
    :func:`speed_per_row` scores by rows decoded instead)."""
    if settings is None:
        settings = candidates_for(session)
    measurements = {s: Measurement(s) for s in settings}
    alive = list(settings)
    used = 0
    batch = first_round
    total_steps = _planned_steps(len(settings), len(prompts), first_round)
    step = 0
    timed_is_greedy = sampling_key(sampling) == GREEDY_KEY  # then the timed runs are the identity's runs too
    _run(session, prompts[0], 8, SPECULATION_OFF)  # warm-up
    noise = identity.measure_noise(session)
    while used < len(prompts) and alive:
        chunk = prompts[used:used + batch]
        for i, prompt in enumerate(chunk):
            if len(alive) == 1:  # only "off" is left: nothing to compare
                break
            prompt_sampling = seeded(sampling, used + i)
            off = _run(session, prompt, max_tokens, SPECULATION_OFF, sampling=prompt_sampling)
            measurements[SPECULATION_OFF].add(off, off, speed=speed)
            off_greedy = off if timed_is_greedy else None
            off_margins: list[float] | None = None
            for s in list(alive):
                if not s.enabled:
                    continue
                m = measurements[s]
                result = _run(session, prompt, max_tokens, s, sampling=prompt_sampling)
                if off_greedy is None:
                    off_greedy = _run(session, prompt, max_tokens, SPECULATION_OFF)
                greedy = result if timed_is_greedy else _run(session, prompt, max_tokens, s)
                if greedy.tokens != off_greedy.tokens and off_margins is None:
                    # margins cost a pass over the vocabulary per token: only
                    # when needed, and never inside a timed "off" run
                    off_margins = _run(session, prompt, max_tokens, SPECULATION_OFF, margins=True).margins
                prompt_tokens = render_prompt(session, GenerateRequest(messages=tuple(prompt)))[0]
                # a parting beyond the noise is measured again where it happened (MoE router ties)
                m.add(result, off, identity.classify_along(session, prompt_tokens, off_greedy.tokens,
                                                           off_margins or [], greedy.tokens, noise), speed=speed)
                step += 1
                if progress:
                    progress({"step": step, "total": total_steps, "setting": s.label, "tps": m.tps[-1],
                              "ratio": m.ratios[-1], "acceptance": m.acceptance})
                if m.mean_ratio < CLEARLY_WORSE:  # no noise makes this a winner: stop paying for it
                    m.dropped_after = used + i + 1
                    alive.remove(s)
        used += len(chunk)
        spec = sorted((s for s in alive if s.enabled), key=lambda s: -measurements[s].mean_ratio)
        if not spec:
            break
        keep = spec[: max(1, (len(spec) + 1) // 2)] if used < len(prompts) else spec
        for s in spec:
            if s not in keep:
                measurements[s].dropped_after = used
        alive = [SPECULATION_OFF, *keep]
        batch *= 2
    return replace(_decide(list(measurements.values())), sampling=sampling_key(sampling))


def _planned_steps(n_settings: int, n_prompts: int, first: int) -> int:
    alive, used, batch, steps = n_settings - 1, 0, first, 0
    while used < n_prompts and alive > 0:
        chunk = min(batch, n_prompts - used)
        steps += chunk * alive
        used += chunk
        alive = max(1, (alive + 1) // 2) if used < n_prompts else alive
        batch *= 2
    return steps


def _run(session: Session, messages: list[dict[str, str]], max_tokens: int, setting: SpeculativeSettings,
         margins: bool = False, sampling: SamplingParams = GREEDY) -> GenerateResult:
    # every setting runs the same prompts: an n-gram map that kept the last setting's reply would draft
    # it back, all accepted, and a first reply is what is being timed
    if session.ngram_drafter is not None:
        session.ngram_drafter.forget()
    return generate(session, GenerateRequest(messages=tuple(messages), max_tokens=max_tokens, sampling=sampling,
                                             speculative=setting, record_margins=margins))


def _decide(measurements: list[Measurement]) -> TuneResult:
    finalists = [m for m in measurements if m.setting.enabled and m.dropped_after is None and m.identical]
    winners = [m for m in finalists if m.lower_bound > 1.0]
    if winners:
        best = max(winners, key=lambda m: m.mean_ratio)
        reason = (f"{best.setting.label} is {best.mean_ratio:.2f}x as fast as no speculation "
                  f"(at least {best.lower_bound:.2f}x with 95% confidence over {len(best.ratios)} prompts)"
                  f"{_margin(best, measurements)}.")
        return TuneResult(best.setting, measurements, reason)
    top = max(finalists, key=lambda m: m.mean_ratio, default=None)
    if top is None:
        reason = _why_none_finished(measurements)
    else:
        reason = (f"No setting was faster beyond the noise (best: {top.setting.label} at {top.mean_ratio:.2f}x, "
                  f"lower bound {top.lower_bound:.2f}x); speculation stays off.")
    return TuneResult(SPECULATION_OFF, measurements, reason)


def _margin(best: Measurement, measurements: list[Measurement]) -> str:
    """By how much the winner beat the runner-up (over the prompts both ran)."""
    others = [m for m in measurements if m.setting.enabled and m is not best and m.identical and m.ratios]
    if not others:
        return ""
    runner = max(others, key=lambda m: statistics.fmean(m.ratios[: len(best.ratios)]))
    theirs = statistics.fmean(runner.ratios[: len(best.ratios)])
    ours = statistics.fmean(best.ratios[: len(runner.ratios)])
    return f", {100 * (ours / theirs - 1):+.0f}% against the runner-up {runner.setting.label} ({theirs:.2f}x)"


def _why_none_finished(measurements: list[Measurement]) -> str:
    """Why no MTP setting reached the decision, from what was measured: no
    head to try, drafts the target (almost) never accepted, every setting
    clearly slower, or an output that changed. Each calls for a different
    next step, so the verdict must not guess."""
    spec = [m for m in measurements if m.setting.enabled]
    if not spec:
        return "This model has no MTP head, so there was nothing to try; speculation stays off."
    drafted, accepted = sum(m.drafted for m in spec), sum(m.accepted for m in spec)
    fastest = max(spec, key=lambda m: m.mean_ratio)
    best = f"best: {fastest.setting.label} at {fastest.mean_ratio:.2f}x"
    if not drafted or accepted / drafted < RARELY_ACCEPTED:
        return (f"MTP drafts were never (or almost never) accepted on this model: {accepted} of {drafted} drafted "
                f"tokens, so every setting was slower than no speculation ({best}); speculation stays off. "
                "Check that the MTP head (or sidecar) was made for this exact model.")
    changed = [m for m in spec if not m.identical]
    if changed:
        return (f"{len(changed)} MTP setting(s) changed the output beyond numeric noise, which is an engine defect "
                "(please report it, naming the model); speculation stays off.")
    return (f"Every MTP setting was clearly slower than no speculation ({best}, {100 * accepted / drafted:.0f}% of "
            "drafts accepted); speculation stays off.")
