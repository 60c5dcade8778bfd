"""How a reply is sampled and drafted, as the app keeps it: one
:class:`SamplingParams` beside the length and speculation choices, in the
preferences and in each chat's own settings (a chat's over the preferences).

Stored nested (``{"sampling": {...}, "max_tokens": ...}``). Settings files and
chats stored before that hold the sampling fields flat, with seed -1 for "a
new one each reply"; both still read, and -1 becomes the engine's
``RANDOM_SEED``, the one "random" the app passes on.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from app.settings_check import acceptable, same_type
from engine.sampling import RANDOM_SEED, SamplingParams

SAMPLING_FIELDS = tuple(f.name for f in dataclasses.fields(SamplingParams))
OLD_RANDOM_SEED = -1  # what flat files and the seed box say for RANDOM_SEED


@dataclass(frozen=True)
class ReplyValues:
    """How a reply in one chat is sampled and drafted: its own settings over the preferences."""

    sampling: SamplingParams
    max_tokens: int
    speculative: str  # auto | mtp | ngram | mtp+ngram | off
    n_max: int
    p_min: float
    # sampled replies: probabilistic draft acceptance (engine.speculative.settings.PROBABILISTIC)
    probabilistic_drafts: bool = False


REPLY_FIELDS = tuple(f.name for f in dataclasses.fields(ReplyValues))


def read_sampling(data: Mapping[str, Any], base: SamplingParams) -> tuple[SamplingParams, list[str]]:
    """The sampling ``data`` holds (nested under ``"sampling"``, or flat as
    older files and chats wrote it) over ``base``, and the names of the fields
    that could not be used (wrong type or out of range: they keep ``base``'s value).
    """
    nested = data.get("sampling")
    source = nested if isinstance(nested, Mapping) else data
    values: dict[str, Any] = {}
    unusable = [] if nested is None or isinstance(nested, Mapping) else ["sampling"]
    for name in SAMPLING_FIELDS:
        if name not in source:
            continue
        value, default = source[name], getattr(base, name)
        if not (same_type(value, default) and acceptable(name, value, default)):
            unusable.append(name)
            continue
        values[name] = float(value) if isinstance(default, float) else value  # JSON by hand: 1 for 1.0
    if values.get("seed") == OLD_RANDOM_SEED:
        values["seed"] = RANDOM_SEED
    try:
        return dataclasses.replace(base, **values), unusable
    except ValueError:  # in the app's ranges field by field, yet refused together: keep the base
        return base, unusable + sorted(values)


def effective(preferences: ReplyValues, chat: Mapping[str, Any]) -> ReplyValues:
    """The values a reply in this chat uses: the chat's own, else the preferences'
    (a chat saved before a field existed takes that field from the preferences)."""
    sampling, _ = read_sampling(chat, preferences.sampling)
    rest = {name: chat.get(name, getattr(preferences, name)) for name in REPLY_FIELDS if name != "sampling"}
    return ReplyValues(sampling=sampling, **rest)


def stored(values: ReplyValues) -> dict[str, Any]:
    """``values`` as a chat stores them (JSON; the sampling nested)."""
    return dataclasses.asdict(values)
