"""What a chat reply asks of the engine's speculative decoding: the user's
choice (auto | mtp | ngram | mtp+ngram | off) made into :class:`SpeculativeSettings`.

"auto" is the autotune profile when there is one, else MTP with adaptive
depth up to the chosen n_max when the loaded model can draft (it falls back
to plain steps where drafts do not pay), else off.
"""

from __future__ import annotations

from dataclasses import replace

from app.reply_values import ReplyValues
from engine.speculative.settings import ADAPTIVE, MODES, MTP, PROBABILISTIC, SPECULATION_OFF, SpeculativeSettings


def speculative_for(values: ReplyValues, profile: SpeculativeSettings | None,
                    model_has_mtp: bool) -> SpeculativeSettings:
    """The settings for ``values``' choice, with probabilistic draft acceptance when it is on.

    Raises:
        ValueError: the chosen n_max or p_min are not valid (a hand-edited settings file).
    """
    chosen = _chosen(values, profile, model_has_mtp)
    return replace(chosen, draft_sampling=PROBABILISTIC) if values.probabilistic_drafts and chosen.enabled \
        else chosen


def _chosen(values: ReplyValues, profile: SpeculativeSettings | None, model_has_mtp: bool) -> SpeculativeSettings:
    v = values
    if v.speculative == "off" or (v.speculative == "auto" and not model_has_mtp):
        return SPECULATION_OFF
    if v.speculative == "auto" and profile is not None:
        return profile
    if v.speculative == "auto":
        return SpeculativeSettings(MTP, v.n_max, 0, v.p_min, depth=ADAPTIVE)
    return SpeculativeSettings(v.speculative if v.speculative in MODES else MTP, v.n_max, 0, v.p_min)
