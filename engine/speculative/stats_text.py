"""Statistics in words: the one formatter behind the CLI's report, a reply's
footer, the status bar and the live panel, so a figure reads the same
wherever it is shown (definitions in docs/statistics.md)."""

from __future__ import annotations

from engine.speculative.stats import StatsSnapshot

PHASE_NAMES = {"catch_up": "catch-up"}


def _num(value: float | None, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def speed(s: StatsSnapshot) -> str:
    """``12.3 tok/s`` (decode), or empty before there is a figure."""
    return f"{s.decode_tps:.1f} tok/s" if s.decode_tps else ""


def acceptance(s: StatsSnapshot) -> str:
    """``MTP 81% accepted``, or empty when nothing was drafted."""
    return f"MTP {100 * (s.acceptance_rate or 0):.0f}% accepted" if s.rounds else ""


def per_position(s: StatsSnapshot) -> str:
    return " ".join(f"{x:.2f}" for x in s.acceptance_per_pos)


def phase_label(s: StatsSnapshot, phase: str) -> str:
    """A phase's name; plain decoding's verify is just decoding."""
    if phase == "verify" and not s.speculative:
        return "decode"
    return PHASE_NAMES.get(phase, phase)


def status_line(s: StatsSnapshot) -> str:
    """The status bar while a reply streams: speed, and acceptance under MTP."""
    return " · ".join(part for part in (speed(s), acceptance(s)) if part)


def footer(s: StatsSnapshot | None, status: str) -> str:
    """The line under a reply: how it ended (unless it simply finished), then its figures."""
    parts = {"interrupted": ["interrupted: the engine stopped before the reply ended"],
             "cancelled": ["stopped"], "error": ["failed"]}.get(status, [])
    if s is not None:
        parts.append(f"{s.generated_tokens} tokens")
        parts += [text for text in (speed(s), acceptance(s)) if text]
        if s.rounds:
            parts.append(f"mean length {s.mean_accepted_length or 0:.2f}")
        parts.append(f"{s.elapsed:.1f} s")
    return " · ".join(parts)


def panel_lines(s: StatsSnapshot) -> list[str]:
    """The live panel's "Speculative decoding" section."""
    if not s.rounds:
        return ["no drafts yet" if s.speculative else "off for this reply"]
    return [
        f"{s.mode}, rollback: {s.rollback}",
        f"acceptance {100 * (s.acceptance_rate or 0):.1f}%  ({s.accepted}/{s.drafted})",
        f"mean accepted length {s.mean_accepted_length or 0:.2f}",
        f"rounds {s.rounds}",
    ]


def report(s: StatsSnapshot, finish: str) -> str:
    """The CLI's report after a reply: one line, plus MTP and timing lines under MTP."""
    text = (f"[{finish}] {s.prompt_tokens} prompt tokens ({_num(s.prompt_tps)} tok/s), "
            f"{s.generated_tokens} generated, decode {_num(s.decode_tps)} tok/s, "
            f"end-to-end {_num(s.end_to_end_tps)} tok/s, {s.elapsed:.2f} s")
    if s.rounds:
        text += (f"\n[mtp] {s.mode}, rollback {s.rollback}: {s.rounds} rounds, "
                 f"{s.accepted}/{s.drafted} drafts accepted ({100 * (s.acceptance_rate or 0):.1f}%), "
                 f"mean accepted length {s.mean_accepted_length or 0:.2f}, per position {per_position(s)}")
        text += "\n[time] " + ", ".join(f"{k} {1000 * v:.0f} ms" for k, v in s.phase_seconds.items())
    return text
