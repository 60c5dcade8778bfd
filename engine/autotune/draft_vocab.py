"""The MTP head's draft vocabulary, measured: the whole vocabulary or its first
:data:`CUT` token ids (``LoadOptions.draft_vocab``, patch 0008).

Why measure: at a real vocabulary (151,936 tokens and more) the head's LM
head is most of a draft step, and cutting it to the first 32,768 ids (the
frequent ones in a byte-pair vocabulary) makes every draft step cheaper. But
a token past the cut can no longer be drafted, so acceptance may drop; how
much depends on the model and on what the user writes. Only timing the
chosen setting both ways on the user's prompts tells which wins.

It is timed before the settings search, at a fixed depth of 2
(:func:`timing_setting`): at a real vocabulary on a CPU the whole head can
make every depth slower than plain decoding, so a search run first would
turn MTP off before the cut that makes it pay was ever tried. The search then
runs with the vocabulary chosen here.

Rule (the same as the thread counts'): the whole vocabulary is the baseline;
the cut wins only when its per-prompt speed ratio's one-sided 95 % lower
bound is above 1.0. Output is the same either way (the target verifies over
every token), so there is no identity to check.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.autotune.paired import paired_replies
from engine.autotune.search import RatioStats
from engine.generation.session import Session
from engine.sampling import GREEDY, SamplingParams
from engine.speculative.settings import SpeculativeSettings, mtp

CUT = 32_768  # the cut tried: past it lie rare words, names and code identifiers of a byte-pair vocabulary


def timing_setting(session: Session) -> SpeculativeSettings:
    """What the cut is timed with: MTP at depth 2 (or the deepest the head drafts, if less)."""
    return mtp(max(1, min(2, session.max_draft)))


def worth_trying(session: Session, spec: SpeculativeSettings) -> bool:
    """Whether a cut could matter: the setting drafts with an MTP head whose vocabulary is well past it."""
    return spec.uses_mtp and session.mtp_drafter is not None and session.model.n_vocab >= 2 * CUT


@dataclass
class VocabMeasurement(RatioStats):
    draft_vocab: int  # 0: the whole vocabulary
    tps: list[float] = field(default_factory=list)
    ratios: list[float] = field(default_factory=list)  # vs the whole vocabulary on the same prompt
    acceptance: list[float] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"first {self.draft_vocab:,} tokens" if self.draft_vocab else "whole vocabulary"


@dataclass
class VocabChoice:
    draft_vocab: int  # 0: the whole vocabulary
    measurements: list[VocabMeasurement]
    n_vocab: int

    @property
    def reason(self) -> str:
        if not self.draft_vocab:
            return (f"the head drafts among all {self.n_vocab:,} tokens: drafting among the first {CUT:,} was "
                    "not faster beyond the noise.")
        won = next(m for m in self.measurements if m.draft_vocab == self.draft_vocab)
        return (f"the head drafts among the first {self.draft_vocab:,} of {self.n_vocab:,} tokens: "
                f"{won.mean_ratio:.2f}x the speed of the whole vocabulary (at least {won.lower_bound:.2f}x "
                "with 95% confidence).")

    def table(self) -> str:
        lines = [f"{'draft vocabulary':>22} {'tok/s':>7} {'vs whole':>8} {'low 95%':>8} {'accept':>7}"]
        for m in self.measurements:
            mark = " <- chosen" if m.draft_vocab == self.draft_vocab else ""
            lines.append(f"{m.label:>22} {statistics.fmean(m.tps) if m.tps else 0:7.1f} {m.mean_ratio:7.2f}x "
                         f"{m.lower_bound:7.2f}x {statistics.fmean(m.acceptance) if m.acceptance else 0:6.0%}{mark}")
        return "\n".join(lines)


def choose(session: Session, prompts: list[list[dict[str, str]]], spec: SpeculativeSettings, *,
           max_tokens: int = 48, sampling: SamplingParams = GREEDY,
           progress: Callable[[str], None] | None = None) -> VocabChoice:
    """Time ``spec`` with the whole vocabulary and with the first :data:`CUT` ids on ``prompts`` (with
    ``sampling``, seeded alike for both per prompt, as the search does), alternating the order per prompt;
    leave the winner set on the session."""
    rows = {n: VocabMeasurement(n) for n in (0, CUT)}
    for replies in paired_replies(session, prompts, list(rows), session.set_draft_vocab, spec, max_tokens=max_tokens,
                                  sampling=sampling, label=lambda n: rows[n].label, progress=progress):
        tps = {n: r.stats.decode_tps() or 0.0 for n, r in replies.items()}
        for n, row in rows.items():
            row.acceptance.append(replies[n].stats.acceptance_rate or 0.0)
            row.tps.append(tps[n])
            row.ratios.append(tps[n] / tps[0] if tps[0] else 1.0)
    cut = rows[CUT]
    best = CUT if cut.lower_bound > 1.0 else 0
    session.set_draft_vocab(best)
    return VocabChoice(best, list(rows.values()), session.model.n_vocab)
