"""The drafter interface.

Names follow llama.cpp's ``common/speculative.h`` (begin / process / draft /
accept, ``id_last``, ``pos0``) because users know them from llama.cpp. As
there, the settings are given once per generation (:meth:`Drafter.begin`)
and each call passes only what changes.
"""

from __future__ import annotations

from typing import Protocol

from engine.speculative.settings import MAX_DRAFT, SpeculativeSettings

__all__ = ["MAX_DRAFT", "Drafter", "SpeculativeSettings"]


class Drafter(Protocol):
    """Proposes tokens for the target to verify.

    The generation loop calls, per generation: ``begin`` once with the
    generation's settings (already limited to what this model can draft);
    ``process`` after each prompt chunk the target decoded; ``draft`` before
    each verify; ``verified`` right after each verify decode (before anything
    else decodes on the target); ``accept`` after each verify with how many
    drafted tokens the target agreed with.

    ``seconds`` holds the generation's ``draft`` and ``catch_up`` time, reset
    by ``begin``; the generator books it into its statistics. ``source`` names
    what proposed the last draft (``"mtp"``, ``"ngram"``): statistics count
    drafted and accepted tokens per source.
    """

    source: str
    n_heads: int
    chained: bool
    seconds: dict[str, float]

    def begin(self, settings: SpeculativeSettings) -> None: ...

    def process(self, tokens: list[int], pos_start: int) -> None: ...

    def verified(self, tokens: list[int], pos_start: int) -> None: ...

    def draft(self, id_last: int, pos0: int, room: int) -> list[int]: ...

    def accept(self, n_accepted: int, pos0: int) -> None: ...

    def close(self) -> None: ...
