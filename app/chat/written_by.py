"""Which model and settings wrote a reply, kept with it and said in its footer.

A chat can change models and sampling between replies; a reply that does not say what wrote it cannot be
compared with the next. The reply's statistics already carry the speculative settings it ran with; the
model's file name and the sampling preset are added to the stored statistics under :data:`KEY` (the
statistics are the app's own JSON, so no column is added and every version of a reply keeps its own), and
taken off again before the statistics are read.
"""

from __future__ import annotations

from typing import Any

from engine.sampling import SamplingParams, sampling_key, sampling_label
from engine.speculative.stats import StatsSnapshot

KEY = "written_by"


def sampling_words(sampling: SamplingParams) -> str:
    """The sampling in a word or two: a preset's name (``balanced``), else ``temperature 0.7``."""
    label = sampling_label(sampling_key(sampling))
    return f"temperature {sampling.temperature:g}" if label == "custom" else label


def with_author(stats: dict[str, Any], author: dict[str, str]) -> dict[str, Any]:
    """``stats`` (a StatsSnapshot's dict) with what wrote the reply."""
    return {**stats, KEY: dict(author)} if author else stats


def split(raw: Any) -> tuple[Any, dict[str, str]]:
    """Stored statistics as the reader of statistics expects them, and what wrote the reply ({}: not said)."""
    if not isinstance(raw, dict) or KEY not in raw:
        return raw, {}
    author = raw[KEY] if isinstance(raw[KEY], dict) else {}
    return {k: v for k, v in raw.items() if k != KEY}, {k: v for k, v in author.items() if isinstance(v, str)}


def author_text(author: dict[str, str], stats: StatsSnapshot | None) -> str:
    """``Qwen3-8B-Q4_K_M.gguf · balanced sampling · mtp n_max=3`` (or ``… · temperature 0.7 · …``): as much
    of it as is known."""
    sampling = author.get("sampling", "")
    parts = [author.get("model", ""), sampling if sampling.startswith("temperature") else
             f"{sampling} sampling" if sampling else ""]
    if stats is not None:
        parts.append(stats.settings.label)
    return " · ".join(p for p in parts if p)
