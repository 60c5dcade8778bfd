"""Which model and settings wrote a reply, kept with it and said in its footer.

A chat can change models and sampling between replies; a reply that does not say what wrote it cannot be
compared with the next. The reply's statistics already carry the speculative settings it ran with; the
model's file name and the sampling preset are added to the stored statistics under :data:`KEY` (the
statistics are the app's own JSON, so no column is added and every version of a reply keeps its own), and
taken off again before the statistics are read.

The same goes for which characters came from accepted drafts (:data:`DRAFTS_KEY`, character spans of the
reply's text): "Highlight text from accepted drafts" showed them while the reply streamed and lost them
once the chat was opened again.

And how much of a reply came before its last part (:data:`CONTINUED_KEY`): after Continue the statistics
are the last request's (its tokens, its speed), so the footer adds the whole reply's token count to them.
"""

from __future__ import annotations

from typing import Any

from engine.sampling import SamplingParams, sampling_key, sampling_label
from engine.speculative.stats import StatsSnapshot

KEY = "written_by"
DRAFTS_KEY = "draft_spans"  # [[start, end], ...]: characters of the reply's text from accepted drafts
CONTINUED_KEY = "continued"  # {"tokens": the whole reply's, "parts": the requests that wrote it}: after Continue


def sampling_words(sampling: SamplingParams) -> str:
    """The sampling in a word or two: a preset's name (``balanced``), else ``temperature 0.7``."""
    label = sampling_label(sampling_key(sampling))
    return f"temperature {sampling.temperature:g}" if label == "custom" else label


def with_author(stats: dict[str, Any], author: dict[str, str], spans: list[tuple[int, int]] | None = None,
                continued: tuple[int, int] | None = None) -> dict[str, Any]:
    """``stats`` (a StatsSnapshot's dict) with what wrote the reply and, when known, its draft spans and (a
    continued reply) its whole token count and parts."""
    out = {**stats, KEY: dict(author)} if author else dict(stats)
    if spans is not None:
        out[DRAFTS_KEY] = [list(span) for span in spans]
    if continued is not None:
        out[CONTINUED_KEY] = {"tokens": continued[0], "parts": continued[1]}
    return out


def continued_of(raw: Any) -> tuple[int, int] | None:
    """A continued reply's whole token count and parts, from its stored statistics (None: not continued)."""
    value = raw.get(CONTINUED_KEY) if isinstance(raw, dict) else None
    if isinstance(value, dict) and all(isinstance(value.get(k), int) for k in ("tokens", "parts")):
        return value["tokens"], value["parts"]
    return None


def so_far(raw: Any) -> tuple[int, int] | None:
    """The tokens and parts of a reply about to be continued, from its stored statistics (None: not known)."""
    tokens = raw.get("generated_tokens") if isinstance(raw, dict) else None
    return continued_of(raw) or ((tokens, 1) if isinstance(tokens, int) else None)


def split(raw: Any) -> tuple[Any, dict[str, str]]:
    """Stored statistics as the reader of statistics expects them, and what wrote the reply ({}: not said)."""
    if not isinstance(raw, dict) or not {KEY, DRAFTS_KEY, CONTINUED_KEY} & raw.keys():
        return raw, {}
    author = raw.get(KEY) if isinstance(raw.get(KEY), dict) else {}
    return ({k: v for k, v in raw.items() if k not in (KEY, DRAFTS_KEY, CONTINUED_KEY)},
            {k: v for k, v in author.items() if isinstance(v, str)})


def spans_of(segments: list[tuple[str, bool]]) -> list[tuple[int, int]]:
    """The character spans of ``segments`` (text, from accepted drafts) that came from drafts."""
    spans, at = [], 0
    for text, drafted in segments:
        if drafted and text:
            spans.append((at, at + len(text)))
        at += len(text)
    return spans


def segments_of(content: str, raw: Any) -> list[tuple[str, bool]]:
    """``content`` cut into (text, from accepted drafts) by the spans stored with it (none: all plain)."""
    spans = raw.get(DRAFTS_KEY) if isinstance(raw, dict) else None
    out: list[tuple[str, bool]] = []
    at = 0
    for span in spans if isinstance(spans, list) else []:
        if not (isinstance(span, list) and len(span) == 2 and all(isinstance(i, int) for i in span)):
            continue
        start, end = max(span[0], at), min(span[1], len(content))
        if start >= end:
            continue
        if start > at:
            out.append((content[at:start], False))
        out.append((content[start:end], True))
        at = end
    if at < len(content) or not out:
        out.append((content[at:], False))
    return out


def author_text(author: dict[str, str], stats: StatsSnapshot | None) -> str:
    """``Qwen3-8B-Q4_K_M.gguf · balanced sampling · mtp n_max=3`` (or ``… · temperature 0.7 · …``): as much
    of it as is known."""
    sampling = author.get("sampling", "")
    parts = [author.get("model", ""), sampling if sampling.startswith("temperature") else
             f"{sampling} sampling" if sampling else ""]
    if stats is not None:
        parts.append(stats.settings.label)
    return " · ".join(p for p in parts if p)
