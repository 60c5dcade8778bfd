"""Statistics in words: the one formatter behind the CLI's report, a reply's
footer, the status bar and the live panel, so a figure reads the same
wherever it is shown (definitions in docs/statistics.md)."""

from __future__ import annotations

from engine.sampling import sampling_label
from engine.speculative.stats import StatsSnapshot

PHASE_NAMES = {"catch_up": "catch-up"}

# Every MTP term the app shows, in plain words (the panel's tooltips; docs/statistics.md defines them exactly).
GLOSSARY = {
    "speedup": "How much faster replies are with MTP than plain decoding of the same model on this machine. "
               "Stated only where it was measured: autotune timed both on this model, with this reply's "
               "sampling. With another sampling (drafts are accepted differently) the panel gives this reply's "
               "tokens per step and names the sampling autotune used.",
    "draft depth": "n_max: the most tokens MTP drafts per step. Deeper drafts pay off only when most are accepted. "
                   "Adaptive depth chooses each step's length from the acceptance and timings it measures.",
    "gate": "p_min: drafting stops at a token the MTP head is less sure of than this.",
    "rollback": "How rejected draft tokens are removed from the model's memory: kv drops them from the "
                "attention cache; rs_seq and checkpoint rewind the recurrent state of hybrid models.",
    "acceptance": "The share of drafted tokens the full model agreed with (it checks every one).",
    "acceptance per position": "For each draft position: how often a draft reaching it was accepted. "
                               "Later positions are accepted less often.",
    "mean accepted length": "Tokens gained per full-model step: 1 + accepted drafts per step. 1.0 means no "
                            "draft was accepted; MTP pays off well above 1.",
    "rounds": "Full-model steps that checked at least one drafted token.",
    "prefill": "Reading the prompt: the full model processes it in chunks before the first reply token.",
    "draft": "The MTP head proposing the next tokens.",
    "verify": "The full model checking the drafted tokens in one batch (in plain decoding: one token per step).",
    "decode": "The full model producing one token per step.",
    "catch-up": "Feeding the full model's state to the MTP head after each check, so it drafts from the right "
                "place.",
    "sampling": "Choosing each token from the model's probabilities (temperature, penalties …).",
    "draft source": "What proposed the accepted tokens: MTP (the model's prediction heads) or n-gram (a copy of "
                    "what followed the same words earlier in the conversation). accepted/drafted per source.",
    "other": "Everything else: the loop itself, turning tokens into text, stop strings, events.",
}


def _num(value: float | None, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def speed(s: StatsSnapshot) -> str:
    """``12.3 tok/s`` (decode), or empty before there is a figure."""
    return f"{s.decode_tps:.1f} tok/s" if s.decode_tps else ""


SOURCE_NAMES = {"mtp": "MTP", "ngram": "n-gram"}


def drafting(s: StatsSnapshot) -> str:
    """Who drafts in this reply: ``MTP``, ``n-gram`` or ``MTP + n-gram``."""
    mode = s.settings.mode
    return " + ".join(SOURCE_NAMES.get(part, part) for part in mode.split("+")) if s.speculative else "MTP"


def acceptance(s: StatsSnapshot) -> str:
    """``MTP 81% accepted``, or empty when nothing was drafted."""
    return f"{drafting(s)} {100 * (s.acceptance_rate or 0):.0f}% accepted" if s.rounds else ""


def source_items(s: StatsSnapshot) -> list[tuple[str, str]]:
    """One panel line per draft source: ``n-gram drafts: 95/100 accepted``."""
    return [(f"{SOURCE_NAMES.get(src, src)} drafts: {s.accepted_by_source.get(src, 0)}/{drafted} accepted",
             "draft source") for src, drafted in sorted(s.drafted_by_source.items())]


def sources(s: StatsSnapshot) -> str:
    """Accepted/drafted tokens per draft source: ``MTP 40/60 · n-gram 95/100``
    (empty before any draft); each source's counts add up to the totals."""
    return " · ".join(f"{SOURCE_NAMES.get(src, src)} {s.accepted_by_source.get(src, 0)}/{drafted}"
                      for src, drafted in sorted(s.drafted_by_source.items()))


def per_position(s: StatsSnapshot) -> str:
    return " ".join(f"{x:.2f}" for x in s.acceptance_per_pos)


def phase_label(s: StatsSnapshot, phase: str) -> str:
    """A phase's name; plain decoding's verify is just decoding."""
    if phase == "verify" and not s.speculative:
        return "decode"
    return PHASE_NAMES.get(phase, phase)


def depth_text(s: StatsSnapshot) -> str:
    """The draft depth as the panel says it: ``3``, or ``2 now (adaptive, up to 8)``
    while adaptive depth chooses each round's length."""
    if not s.speculative:
        return s.settings.label
    if s.settings.adaptive and s.draft_depth is not None:
        return f"{s.draft_depth} now (adaptive, up to {s.settings.n_max})"
    return str(s.settings.n_max)


def headline(s: StatsSnapshot, speedup: float | None = None, source: str = "autotuned", *,
             measured_with: str | None = None, sampling: str | None = None) -> str:
    """The first line about MTP: the speedup where one was measured (``source`` says
    how), else what was measured in this reply; never a guess.

    A speedup holds for the sampling it was measured with (acceptance at
    temperature 0.6 with penalties is not greedy acceptance): when
    ``measured_with`` and this reply's ``sampling`` (keys of
    :func:`engine.sampling.sampling_key`) differ, the line gives this reply's
    own tokens per step and says which sampling the figure was tuned for.
    """
    if not s.speculative:
        return "MTP off: plain decoding"
    who = drafting(s)
    if speedup and measured_with is not None and sampling is not None and measured_with != sampling:
        tuned = f"{source} for {sampling_label(measured_with)}"
        return f"{who}: {s.tokens_per_step or 1:.2f} tokens per step ({tuned})" if s.rounds \
            else f"{who}: no drafts yet ({tuned})"
    if speedup:
        if speedup >= 1.05:
            return f"{who}: {speedup:.1f}× faster than without ({source})"
        return f"{who}: about as fast as without ({source})"
    if s.rounds:
        return f"{who}: {s.tokens_per_step or 1:.2f} tokens per step (speedup not measured)"
    return f"{who}: no drafts yet"


def prefill_progress(done: int, total: int) -> str:
    """While the prompt is read: ``Processing prompt (1,234 tokens)… 40%``."""
    percent = f" {100 * done // total}%" if total and done else ""
    return f"Processing prompt ({total:,} tokens)…{percent}"


def status_line(s: StatsSnapshot) -> str:
    """The status bar while a reply streams: speed, and acceptance under MTP."""
    return " · ".join(part for part in (speed(s), acceptance(s)) if part)


def footer(s: StatsSnapshot | None, status: str, continued: tuple[int, int] | None = None) -> str:
    """The line under a reply: how it ended (unless it simply finished), then its figures. ``continued``
    (the whole reply's tokens and parts, after Continue): ``s`` is the last part's, so the whole count
    comes first and the figures after it are labelled as the last part's."""
    parts = {"interrupted": ["interrupted: the engine stopped before the reply ended"],
             "cancelled": ["stopped"], "error": ["failed"]}.get(status, [])
    if s is not None and continued is not None:
        parts += [f"{continued[0]} tokens, continued", f"last part: {s.generated_tokens} tokens"]
    elif s is not None:
        parts.append(f"{s.generated_tokens} tokens")
    if s is not None:
        parts += [text for text in (speed(s), acceptance(s)) if text]
        if s.rounds:
            parts.append(f"mean length {s.mean_accepted_length or 0:.2f}")
        parts.append(f"{s.elapsed:.1f} s")
    return " · ".join(parts)


def panel_items(s: StatsSnapshot) -> list[tuple[str, str]]:
    """The live panel's "Speculative decoding" section: each line and the
    :data:`GLOSSARY` term that explains it."""
    if not s.rounds:
        return [("no drafts yet" if s.speculative else "off for this reply", "draft depth")]
    return [
        (f"draft depth {depth_text(s)}, rollback: {s.rollback}", "rollback"),
        (f"acceptance {100 * (s.acceptance_rate or 0):.1f}%  ({s.accepted}/{s.drafted})", "acceptance"),
        (f"mean accepted length {s.mean_accepted_length or 0:.2f}", "mean accepted length"),
        (f"rounds {s.rounds}", "rounds"),
        *source_items(s),
    ]


def panel_lines(s: StatsSnapshot) -> list[str]:
    """The live panel's "Speculative decoding" section, as text."""
    return [text for text, _term in panel_items(s)]


def report(s: StatsSnapshot, finish: str) -> str:
    """The CLI's report after a reply: one line, plus MTP and timing lines under MTP."""
    reused = f", {s.prompt_reused} reused" if s.prompt_reused else ""
    text = (f"[{finish}] {s.prompt_tokens} prompt tokens{reused} ({_num(s.prompt_tps)} tok/s), "
            f"{s.generated_tokens} generated, decode {_num(s.decode_tps)} tok/s, "
            f"end-to-end {_num(s.end_to_end_tps)} tok/s, {s.elapsed:.2f} s")
    if s.rounds:
        text += (f"\n[mtp] {s.settings.label}, rollback {s.rollback}: {s.rounds} rounds, "
                 f"{s.accepted}/{s.drafted} drafts accepted ({100 * (s.acceptance_rate or 0):.1f}%), "
                 f"mean accepted length {s.mean_accepted_length or 0:.2f}, per position {per_position(s)}")
        text += f"\n[sources] accepted/drafted: {sources(s)}"
        text += "\n[time] " + ", ".join(f"{k} {1000 * v:.0f} ms" for k, v in s.phase_seconds.items())
    return text
