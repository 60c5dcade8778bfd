"""Incremental, UTF-8-safe detokenization.

A token may end in the middle of a multi-byte character; the incremental
decoder holds those bytes back until the character is complete, so streamed
text never shows replacement characters that the final text would not.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable


class Detokenizer:
    def __init__(self, piece: Callable[[int], bytes]) -> None:
        self._piece = piece
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token: int) -> str:
        """Return the text that ``token`` completes (possibly empty)."""
        return self._decoder.decode(self._piece(token))

    def flush(self) -> str:
        """Return whatever is still held back (an incomplete trailing character)."""
        return self._decoder.decode(b"", final=True)
