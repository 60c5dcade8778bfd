"""The drafter interface and speculative settings.

Names follow llama.cpp's ``common/speculative.cpp`` (begin / process / draft /
accept, ``n_max``, ``n_min``, ``p_min``, ``id_last``, ``pos0``) because users
know them from the llama.cpp command line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

MAX_DRAFT = 8  # the deepest draft a looped single head is asked for


@dataclass(frozen=True)
class SpeculativeParams:
    """Speculative settings of one request.

    Attributes:
        mode: "none" (plain decoding) or "mtp".
        n_max: most draft tokens per round (capped at the head count for chained heads).
        n_min: a draft shorter than this is discarded (the step decodes plainly).
        p_min: stop drafting at the first token whose probability over the whole
            vocabulary is below this.
    """

    mode: str = "none"
    n_max: int = 3
    n_min: int = 0
    p_min: float = 0.0

    @property
    def enabled(self) -> bool:
        return self.mode == "mtp" and self.n_max > 0


class Drafter(Protocol):
    """Proposes tokens for the target to verify.

    The generation loop calls, per generation: ``begin`` once; ``process``
    after each prompt chunk the target decoded; ``draft`` before each verify;
    ``verified`` right after each verify decode (before anything else decodes
    on the target); ``accept`` after each verify with how many drafted tokens
    the target agreed with.
    """

    n_heads: int

    def begin(self) -> None: ...

    def process(self, tokens: list[int], pos_start: int) -> None: ...

    def verified(self, tokens: list[int], pos_start: int) -> None: ...

    def draft(self, id_last: int, pos0: int, n_max: int, n_min: int, p_min: float) -> list[int]: ...

    def accept(self, n_accepted: int, pos0: int) -> None: ...

    def close(self) -> None: ...
