"""Which drafter and depth policy a request runs with: the one place that chooses.

Why one type: a single-sequence session (engine/generation/session.py) and
every sequence of a multi-sequence one (engine/generation/sequences.py) make
the same choice for a request, and keep the same things between requests (the
n-gram map, the MTP + n-gram composition, the adaptive policies' measured
acceptance and costs). Written twice, the two engines' drafts and depths would
drift apart; a sequence's greedy output must be what it is alone.

The MTP drafter is not owned here: the session owns it and its per-sequence
lanes, and passes the one this sequence drafts with to :meth:`DrafterChoice.choose`.
"""

from __future__ import annotations

from engine.speculative.adaptive import AdaptiveDepth
from engine.speculative.adaptive.gated import GatedDepth
from engine.speculative.compose import ComposeDrafter
from engine.speculative.depth import PLAIN, DepthPolicy, FixedDepth
from engine.speculative.drafter import Drafter, PlainDrafter
from engine.speculative.mtp import MTPDrafter
from engine.speculative.ngram import NgramDrafter
from engine.speculative.settings import MAX_DRAFT, MTP, MTP_NGRAM, SPECULATION_OFF, SpeculativeSettings, deepest_draft

# an adaptive policy per (mode, n_max, target threads, draft threads): other threads, other costs
PolicyKey = tuple[str, int, int, int]


class DrafterChoice:
    """One sequence's drafters and adaptive depth policies, kept between its requests.

    Each sequence needs its own: a plain drafter carries a request's guide and
    margins, the n-gram map is the sequence's own text, and adaptive depth
    learns the acceptance of the text this sequence drafts.
    """

    def __init__(self) -> None:
        self.plain = PlainDrafter()
        self.ngram: NgramDrafter | None = None  # made by the first request that drafts n-grams
        self.composed: ComposeDrafter | None = None  # made by the first "mtp+ngram" request
        self.policies: dict[PolicyKey, AdaptiveDepth] = {}
        self.gated: dict[PolicyKey, GatedDepth] = {}  # the same policies behind a gate, for a sequence alone

    def choose(self, settings: SpeculativeSettings, mtp: MTPDrafter | None, target_threads: int,
               alone: bool = False) -> tuple[SpeculativeSettings, Drafter, DepthPolicy]:
        """What a request asking for ``settings`` runs with on a model whose MTP drafter for this
        sequence is ``mtp`` (None: no head): the settings the model allows (the one place its
        limits apply; what the statistics report), the drafter (plain decoding's drafts nothing)
        and the depth policy. Adaptive depth's policy is kept between requests: the costs of
        this machine and model do not change from one reply to the next, unless the threads do.
        ``alone``: a single-sequence session's request, whose adaptive depth goes behind the gate a
        multi-sequence engine keeps for its batches (adaptive/gated.py); that engine's sequences get the
        policy itself, which it chooses for together.
        """
        deepest = deepest_draft(mtp.n_heads, mtp.chained) if mtp is not None else 0
        spec = settings.limited_to(deepest)
        drafter = self._drafter(spec, mtp, deepest)
        if drafter is None:
            return SPECULATION_OFF, self.plain, PLAIN
        if not spec.adaptive:
            # a fixed depth asks for what fits; the drafter's own settings stop it at n_max
            return spec, drafter, FixedDepth(MAX_DRAFT)
        key = (spec.mode, spec.n_max, target_threads, mtp.ctx.threads if mtp is not None else 0)
        if key not in self.policies:
            self.policies[key] = AdaptiveDepth(spec.n_max)
        if not alone:
            return spec, drafter, self.policies[key]
        if key not in self.gated:
            self.gated[key] = GatedDepth(self.policies[key])
        return spec, drafter, self.gated[key]

    def _drafter(self, spec: SpeculativeSettings, mtp: MTPDrafter | None, deepest: int) -> Drafter | None:
        """The drafter for settings already limited to the model; None: plain decoding."""
        if spec.mode == MTP:
            return mtp
        if not spec.uses_ngram:
            return None
        if self.ngram is None:
            self.ngram = NgramDrafter()
        if spec.mode == MTP_NGRAM and mtp is not None:  # without a head, limited_to made it "ngram"
            if self.composed is None:
                self.composed = ComposeDrafter(mtp, self.ngram, deepest)
            return self.composed
        return self.ngram

    def close(self) -> None:
        """Drop the n-gram map (the MTP drafter belongs to the session)."""
        if self.ngram is not None:
            self.ngram.close()
        self.ngram = self.composed = None
