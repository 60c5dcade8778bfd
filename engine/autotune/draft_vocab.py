"""The MTP head's draft vocabulary, measured: the whole vocabulary or its first
65,536 or 32,768 token ids (:data:`CUTS`; ``LoadOptions.draft_vocab``, patch 0008).

Why measure: at a real vocabulary (151,936 tokens and more) the head's LM
head is most of a draft step, and cutting it to the first ids (the frequent
ones in a byte-pair vocabulary numbered in merge order) makes every draft
step cheaper. But a token past the cut can no longer be drafted, so
acceptance may drop; how much depends on the model's vocabulary and on what
the user writes. Measured with Qwen's own byte-pair ranks on English prose,
code and legal text (scripts/draft_vocab_coverage.py): the first 32,768 ids
hold 93-95 % of the tokens and the first 65,536 97-98.5 %, so the larger cut
costs a perfect head 1-6 % of a round's tokens at depths 1-4 and the smaller
2-14 %, while the smaller saves more of each draft step; which wins depends on
the head and the hardware. Gemma 3's 262,144-token vocabulary numbers its
single characters last (punctuation, digits), and its first 65,536 ids hold
only 57-82 % of the same texts. Only timing the chosen setting each way on
the user's prompts tells which wins.

It is timed before the settings search, at a fixed depth of 2
(:func:`timing_setting`): at a real vocabulary on a CPU the whole head can
make every depth slower than plain decoding, so a search run first would
turn MTP off before the cut that makes it pay was ever tried. The search then
runs with the vocabulary chosen here.

Rule (the same as the thread counts'): the whole vocabulary is the baseline;
a cut wins only when its per-prompt speed ratio's one-sided 95 % lower bound
is above 1.0, and of two such cuts the one with the higher mean ratio is
kept. Output is the same either way (the target verifies over every token),
so there is no identity to check.
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

# the cuts tried, each only where it is at most half the vocabulary (less would save little of the
# head's LM head): past them lie rare words, names and code identifiers of a byte-pair vocabulary
CUTS = (65_536, 32_768)


def cuts_for(n_vocab: int) -> tuple[int, ...]:
    """The cuts worth timing on a vocabulary of ``n_vocab`` tokens: those at most half of it."""
    return tuple(cut for cut in CUTS if 2 * cut <= n_vocab)


def timing_setting(session: Session) -> SpeculativeSettings:
    """What the cut is timed with: MTP at depth 2 (or the deepest the head drafts, if less)."""
    return mtp(max(1, min(2, session.max_draft)))


def worth_trying(session: Session, spec: SpeculativeSettings) -> bool:
    """Whether a cut could matter: the setting drafts with an MTP head whose vocabulary is well past one."""
    return spec.uses_mtp and session.mtp_drafter is not None and bool(cuts_for(session.model.n_vocab))


@dataclass
class VocabMeasurement(RatioStats):
    draft_vocab: int  # 0: the whole vocabulary
    tps: list[float] = field(default_factory=list)
    ratios: list[float] = field(default_factory=list)  # vs the whole vocabulary on the same prompt
    acceptance: list[float] = field(default_factory=list)
    # per prompt, the share of the reply's tokens the head may draft (below the cut; 1.0 for the whole
    # vocabulary): how much of what this model writes a cut keeps, measured rather than assumed
    held: list[float] = field(default_factory=list)

    @property
    def held_share(self) -> float:
        return statistics.fmean(self.held) if self.held else 1.0

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
            tried = " or ".join(f"{m.draft_vocab:,}" for m in self.measurements if m.draft_vocab)
            return (f"the head drafts among all {self.n_vocab:,} tokens: drafting among the first {tried} was "
                    "not faster beyond the noise.")
        won = next(m for m in self.measurements if m.draft_vocab == self.draft_vocab)
        return (f"the head drafts among the first {self.draft_vocab:,} of {self.n_vocab:,} tokens: "
                f"{won.mean_ratio:.2f}x the speed of the whole vocabulary (at least {won.lower_bound:.2f}x "
                f"with 95% confidence); they hold {won.held_share:.0%} of the replies' tokens.")

    def table(self) -> str:
        lines = [f"{'draft vocabulary':>22} {'tok/s':>7} {'vs whole':>8} {'low 95%':>8} {'accept':>7} {'held':>5}"]
        for m in self.measurements:
            mark = " <- chosen" if m.draft_vocab == self.draft_vocab else ""
            lines.append(f"{m.label:>22} {statistics.fmean(m.tps) if m.tps else 0:7.1f} {m.mean_ratio:7.2f}x "
                         f"{m.lower_bound:7.2f}x {statistics.fmean(m.acceptance) if m.acceptance else 0:6.0%} "
                         f"{m.held_share:5.0%}{mark}")
        return "\n".join(lines)


def choose(session: Session, prompts: list[list[dict[str, str]]], spec: SpeculativeSettings, *,
           max_tokens: int = 48, sampling: SamplingParams = GREEDY,
           progress: Callable[[str], None] | None = None) -> VocabChoice:
    """Time ``spec`` with the whole vocabulary and with the first ids of each of :func:`cuts_for` on
    ``prompts`` (with ``sampling``, seeded alike for every setting per prompt, as the search does),
    alternating the order per prompt; leave the winner set on the session."""
    rows = {n: VocabMeasurement(n) for n in (0, *cuts_for(session.model.n_vocab))}
    for replies in paired_replies(session, prompts, list(rows), session.set_draft_vocab, spec, max_tokens=max_tokens,
                                  sampling=sampling, label=lambda n: rows[n].label, progress=progress):
        tps = {n: r.stats.decode_tps() or 0.0 for n, r in replies.items()}
        for n, row in rows.items():
            row.acceptance.append(replies[n].stats.acceptance_rate or 0.0)
            row.tps.append(tps[n])
            row.ratios.append(tps[n] / tps[0] if tps[0] else 1.0)
            tokens = replies[n].tokens
            row.held.append(sum(t < n for t in tokens) / len(tokens) if n and tokens else 1.0)
    best = winner(list(rows.values()))
    session.set_draft_vocab(best)
    return VocabChoice(best, list(rows.values()), session.model.n_vocab)


def winner(measurements: list[VocabMeasurement]) -> int:
    """The cut kept: of those whose ratio to the whole vocabulary has its 95 % lower bound above 1.0,
    the one with the higher mean ratio; 0 (the whole vocabulary) where none has."""
    beat = [m for m in measurements if m.draft_vocab and m.lower_bound > 1.0]
    return max(beat, key=lambda m: m.mean_ratio).draft_vocab if beat else 0
