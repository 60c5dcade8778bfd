"""The drafter interface.

Names follow llama.cpp's ``common/speculative.h`` (begin / process / draft /
accept, ``id_last``, ``pos0``) because users know them from llama.cpp. As
there, the settings are given once per generation (:meth:`Drafter.begin`)
and each call passes only what changes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from engine.speculative.settings import MAX_DRAFT, SpeculativeSettings

if TYPE_CHECKING:
    from engine.runtime.distribution import DraftSampler
    from engine.runtime.sampler import DraftGuide
    from engine.speculative.draft_penalties import DraftPenalties

__all__ = ["MAX_DRAFT", "Drafter", "SpeculativeSettings"]


class Drafter(Protocol):
    """Proposes tokens for the target to verify.

    The generation loop calls, per generation: ``begin`` once with the
    generation's settings (already limited to what this model can draft);
    ``process`` after each prompt chunk the target decoded; ``draft`` before
    each verify; ``verified`` right after each verify decode (before anything
    else decodes on the target; ``row0``: the first of its rows in the target's
    batch, which a multi-sequence batch shares with other sequences); ``accept`` after each verify with how many
    drafted tokens the target agreed with.

    ``seconds`` holds the generation's ``draft`` and ``catch_up`` time, reset
    by ``begin``; the generator books it into its statistics. ``source`` names
    what proposed the last draft (``"mtp"``, ``"ngram"``): statistics count
    drafted and accepted tokens per source.

    Per request the loop may set ``guide`` (under a grammar: draft only what
    it allows) and ``draft_margins`` (a list: record each draft token's top-2
    logit margin), and ``draft_sampler`` (probabilistic draft sampling: sample
    each draft from the request's processed distribution and keep it there for
    the target's verification), and ``penalties`` (the request's repetition
    penalties, applied to the drafter's rows as the target's sampler applies
    them to its own); a drafter that cannot use them ignores them.
    ``shadow_probes``: adaptive depth may draft without verifying (the drafter
    is cheap to run alone, as the MTP head is).
    """

    source: str
    seconds: dict[str, float]
    shadow_probes: bool
    guide: DraftGuide | None
    draft_margins: list[float] | None
    draft_sampler: DraftSampler | None
    penalties: DraftPenalties | None

    def begin(self, settings: SpeculativeSettings) -> None: ...

    def process(self, tokens: list[int], pos_start: int, row0: int = 0) -> None: ...

    def verified(self, tokens: list[int], pos_start: int, row0: int = 0) -> None: ...

    def draft(self, id_last: int, pos0: int, room: int) -> list[int]: ...

    def accept(self, n_accepted: int, pos0: int) -> None: ...

    def close(self) -> None: ...


class PlainDrafter:
    """Plain decoding as a drafter that never drafts, so the loop has no special case for it."""

    source = "mtp"  # plain steps are counted apart from any source
    shadow_probes = False

    def __init__(self) -> None:
        self.seconds = {"draft": 0.0, "catch_up": 0.0}
        self.guide: DraftGuide | None = None
        self.draft_margins: list[float] | None = None
        self.draft_sampler: DraftSampler | None = None
        self.penalties: DraftPenalties | None = None

    def begin(self, settings: SpeculativeSettings) -> None:
        pass

    def process(self, tokens: list[int], pos_start: int, row0: int = 0) -> None:
        pass

    def verified(self, tokens: list[int], pos_start: int, row0: int = 0) -> None:
        pass

    def draft(self, id_last: int, pos0: int, room: int) -> list[int]:
        return []

    def accept(self, n_accepted: int, pos0: int) -> None:
        pass

    def close(self) -> None:
        pass
