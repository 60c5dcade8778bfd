"""What each settings field may hold, so one bad value in settings.json costs
that field only.

A value out of these ranges is not only useless: 10^12 for ``n_ctx`` makes a
Qt spin box raise and the app stop starting. The ranges are those of the
widgets that show the fields and of the worker's protocol; a value outside
them is reset to its default and named in a notice.
"""

from __future__ import annotations

import math
from typing import Any

from app.text_check import is_text
from engine.sampling import MAX_SEED
from engine.speculative.settings import MAX_DRAFT

# (lowest, highest) for numbers; a set of the choices for words
RANGES: dict[str, tuple[float, float]] = {
    "n_threads": (1, 512), "n_threads_draft": (0, 512), "n_ctx": (256, 2**24), "n_gpu_layers": (0, 999),
    "max_tokens": (1, 32768), "temperature": (0.0, 5.0), "top_k": (0, 100000), "top_p": (0.0, 1.0),
    "min_p": (0.0, 1.0), "repeat_penalty": (0.5, 3.0), "repeat_last_n": (-1, 1 << 20),
    "presence_penalty": (-2.0, 2.0), "frequency_penalty": (-2.0, 2.0), "seed": (-1, MAX_SEED),
    "n_max": (1, MAX_DRAFT), "p_min": (0.0, 1.0), "server_port": (1, 65535), "parallel": (0, 64),
    "draft_vocab": (0, 2**24),  # each value of draft_vocabs
    "state_cache_mib": (0, 2**20),
}
CHOICES: dict[str, frozenset[str]] = {
    "theme": frozenset({"system", "light", "dark"}),
    "speculative": frozenset({"auto", "off", "mtp", "ngram", "mtp+ngram"}),
}


def acceptable(key: str, value: Any, default: Any) -> bool:
    """Whether ``value`` (already of the default's type, or None where None is the default) may stand."""
    if value is None:
        return default is None
    if key in RANGES:
        low, high = RANGES[key]
        return not (isinstance(value, float) and not math.isfinite(value)) and low <= value <= high
    if key in CHOICES:
        return value in CHOICES[key]
    if isinstance(value, str):  # a lone surrogate from a "\ud800" escape is not text
        return is_text(value)
    if isinstance(value, list):
        return all(isinstance(item, str) and is_text(item) for item in value)
    if isinstance(value, dict) and key == "draft_vocabs":  # per model path: a token count
        low, high = RANGES["draft_vocab"]
        return all(isinstance(k, str) and is_text(k) and isinstance(v, int) and not isinstance(v, bool)
                   and low <= v <= high for k, v in value.items())
    if isinstance(value, dict):
        return all(isinstance(k, str) and isinstance(v, str) and is_text(v) for k, v in value.items())
    return True


def same_type(value: Any, default: Any) -> bool:
    """``value`` has the default's JSON type (a bool is not a number here, an int is a float)."""
    if default is None:
        return value is None or isinstance(value, str)
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(default, bool)
    if isinstance(default, float):
        return isinstance(value, int | float)
    return isinstance(value, type(default))

