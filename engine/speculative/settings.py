"""Speculative settings: the one type every layer passes, from the settings
dialog to the drafter.

Names follow llama.cpp's ``common/speculative.h`` (``n_max``, ``n_min``,
``p_min``) because users know them from its command line. The deepest draft
any drafter is asked for is decided here (:data:`MAX_DRAFT`, and
:func:`deepest_draft` for a loaded model); the worker reports it, and the
app's limits come from that report.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

OFF = "off"
MTP = "mtp"
NGRAM = "ngram"  # n-gram drafts from the context and the conversation (engine/speculative/ngram.py)
MTP_NGRAM = "mtp+ngram"  # both, one per round by a documented policy (engine/speculative/compose.py)
MODES = (OFF, MTP, NGRAM, MTP_NGRAM)
# n-gram lookup: the longest match tried first, the shortest that still drafts
NGRAM_MIN, NGRAM_MAX = 2, 6
NGRAM_LONGEST = 16
FIXED = "fixed"
ADAPTIVE = "adaptive"
DEPTHS = (FIXED, ADAPTIVE)
# How drafts meet a sampled (temperature > 0) target. match: the head drafts its top token, kept while
# it equals the target's sample (the output is the plain, seeded output). probabilistic: the head samples
# its drafts, kept by rejection sampling (engine/speculative/rejection.py): the same distribution, more
# accepted at high temperature, not the same seeded reply. Greedy requests always match.
MATCH = "match"
PROBABILISTIC = "probabilistic"
DRAFT_SAMPLINGS = (MATCH, PROBABILISTIC)
# The deepest draft a looped single head is asked for. It also sizes the
# target's verify batch and the recurrent snapshots of hybrid targets.
MAX_DRAFT = 8


def deepest_draft(n_heads: int, chained: bool) -> int:
    """The largest ``n_max`` worth asking a model for: its head count when the
    heads are chained (one head per position), else :data:`MAX_DRAFT`; 0
    without heads."""
    if n_heads <= 0:
        return 0
    return min(n_heads, MAX_DRAFT) if chained else MAX_DRAFT


@dataclass(frozen=True)
class SpeculativeSettings:
    """How one generation drafts. Checked when made: a bad value never travels.

    Attributes:
        mode: ``"off"`` (plain decoding), ``"mtp"``, ``"ngram"`` (drafts copied
            from what followed the same tokens earlier) or ``"mtp+ngram"``.
        n_max: most draft tokens per round, 1..MAX_DRAFT (a model with fewer
            chained heads drafts at most its head count).
        n_min: a draft shorter than this is discarded (the step decodes plainly); not a sampled
            (probabilistic) draft, whose length must not decide whether it is verified.
        p_min: stop drafting at the first token whose probability is below this.
        ngram_min / ngram_max: n-gram drafting matches the last ``ngram_max``
            tokens first and the last ``ngram_min`` at least; shorter matches
            draft more often and are wrong more often.
        depth: ``"fixed"`` (every round drafts up to ``n_max``) or ``"adaptive"``
            (each round drafts the length that maximises expected tokens per
            second, at most ``n_max``: engine/speculative/adaptive/).
        draft_sampling: ``"match"`` or ``"probabilistic"`` (see :data:`DRAFT_SAMPLINGS`): how MTP
            drafts are made and kept when the request samples (temperature > 0).

    Raises:
        ValueError: a value out of range (the protocol turns it into a
            ``protocol`` error naming the field).
    """

    mode: str = OFF
    n_max: int = 3
    n_min: int = 0
    p_min: float = 0.0
    depth: str = FIXED
    ngram_min: int = NGRAM_MIN
    ngram_max: int = NGRAM_MAX
    draft_sampling: str = MATCH

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {list(MODES)}, not {self.mode!r}")
        if self.depth not in DEPTHS:
            raise ValueError(f"depth must be one of {list(DEPTHS)}, not {self.depth!r}")
        if self.draft_sampling not in DRAFT_SAMPLINGS:
            raise ValueError(f"draft_sampling must be one of {list(DRAFT_SAMPLINGS)}, not {self.draft_sampling!r}")
        if isinstance(self.n_max, bool) or not isinstance(self.n_max, int) or not 1 <= self.n_max <= MAX_DRAFT:
            raise ValueError(f"n_max must be an integer from 1 to {MAX_DRAFT}, not {self.n_max!r}")
        if isinstance(self.n_min, bool) or not isinstance(self.n_min, int) or self.n_min < 0:
            raise ValueError(f"n_min must be a non-negative integer, not {self.n_min!r}")
        if isinstance(self.p_min, bool) or not isinstance(self.p_min, int | float) or self.p_min < 0.0:
            raise ValueError(f"p_min must be a probability (0 or more; above 1 drafts nothing), not {self.p_min!r}")
        for name in ("ngram_min", "ngram_max"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= NGRAM_LONGEST:
                raise ValueError(f"{name} must be an integer from 1 to {NGRAM_LONGEST}, not {value!r}")
        if self.ngram_min > self.ngram_max:
            raise ValueError(f"ngram_min ({self.ngram_min}) must not exceed ngram_max ({self.ngram_max})")

    @property
    def enabled(self) -> bool:
        """Does anything draft (MTP, n-gram or both)?"""
        return self.mode != OFF

    @property
    def uses_mtp(self) -> bool:
        return self.mode in (MTP, MTP_NGRAM)

    @property
    def uses_ngram(self) -> bool:
        return self.mode in (NGRAM, MTP_NGRAM)

    @property
    def label(self) -> str:
        """How a person reads it: ``off``, ``mtp n_max=3 p_min=0.5``, ``ngram n_max=8``,
        ``mtp n_max=3 probabilistic``."""
        if not self.enabled:
            return OFF
        depth = " adaptive" if self.adaptive else ""
        gate = f" p_min={self.p_min:g}" if self.p_min and self.uses_mtp else ""
        sampled = f" {PROBABILISTIC}" if self.probabilistic else ""
        return f"{self.mode}{depth} n_max={self.n_max}" + gate + sampled

    @property
    def probabilistic(self) -> bool:
        """MTP drafts are sampled and kept by rejection sampling (for requests that sample)."""
        return self.uses_mtp and self.draft_sampling == PROBABILISTIC

    @property
    def adaptive(self) -> bool:
        """Each round chooses its own draft length (at most ``n_max``)."""
        return self.enabled and self.depth == ADAPTIVE

    def for_sampling(self, greedy: bool) -> SpeculativeSettings:
        """These settings for a request that samples (or not): a greedy request's drafts always
        match (rejection sampling needs a distribution to sample), and its statistics say so."""
        return replace(self, draft_sampling=MATCH) if greedy and self.draft_sampling != MATCH else self

    def limited_to(self, deepest: int) -> SpeculativeSettings:
        """These settings for a model whose MTP drafts at most ``deepest`` tokens
        (0: no MTP head). n-gram drafting needs no head: ``"ngram"`` is kept as
        it is and ``"mtp+ngram"`` becomes ``"ngram"`` without a head; the
        composition limits its MTP part itself (engine/speculative/compose.py)."""
        if self.mode == MTP_NGRAM and deepest <= 0:
            return replace(self, mode=NGRAM)
        if self.mode != MTP or self.n_max <= deepest:
            return self
        return replace(self, n_max=max(1, deepest)) if deepest > 0 else replace(self, mode=OFF)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SpeculativeSettings:
        """Settings from JSON, old spellings included: profiles written before
        "off" had one name say ``mode: "none"`` (and ``n_max: 0`` for off); before
        ``draft_sampling`` existed, drafts matched."""
        mode = data.get("mode", OFF)
        n_max = data.get("n_max", 3)
        if mode == "none" or not n_max:
            mode, n_max = OFF, 3 if not n_max else n_max
        return cls(mode, int(n_max), int(data.get("n_min", 0)), float(data.get("p_min", 0.0)),
                   depth=str(data.get("depth", FIXED)),
                   ngram_min=int(data.get("ngram_min", NGRAM_MIN)), ngram_max=int(data.get("ngram_max", NGRAM_MAX)),
                   draft_sampling=str(data.get("draft_sampling", MATCH)))


SPECULATION_OFF = SpeculativeSettings()


def mtp(n_max: int = 3, p_min: float = 0.0, n_min: int = 0, depth: str = FIXED,
        draft_sampling: str = MATCH) -> SpeculativeSettings:
    """MTP drafting with these limits (a shorthand for tests and tools)."""
    return SpeculativeSettings(MTP, n_max, n_min, p_min, depth=depth, draft_sampling=draft_sampling)


def ngram(n_max: int = 8, n_min: int = 0, mtp_too: bool = False) -> SpeculativeSettings:
    """n-gram drafting (with MTP: the composition) with these limits (a shorthand for tests and tools)."""
    return SpeculativeSettings(MTP_NGRAM if mtp_too else NGRAM, n_max, n_min)
