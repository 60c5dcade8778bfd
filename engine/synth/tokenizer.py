"""The smallest GPT-2-style vocabulary llama.cpp loads: the 256 byte-level
characters, readable filler words, then BOS and EOS as control tokens."""

from __future__ import annotations

from dataclasses import dataclass

TOKEN_NORMAL = 1
TOKEN_CONTROL = 3


def _byte_chars() -> list[str]:
    """GPT-2's bytes_to_unicode: printable bytes map to themselves, the rest are shifted."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
        range(ord("®"), ord("ÿ") + 1)
    )
    chars = {b: chr(b) for b in printable}
    n = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + n)
            n += 1
    return [chars[b] for b in range(256)]


@dataclass(frozen=True)
class Vocabulary:
    tokens: list[str]
    types: list[int]
    merges: list[str]
    bos: int
    eos: int

    @property
    def n_normal(self) -> int:
        """Tokens [0, n_normal) are ordinary text; the rest are control tokens."""
        return self.bos


def build_vocabulary(n_vocab: int) -> Vocabulary:
    if n_vocab < 260:
        raise ValueError("a synthetic vocabulary needs at least 260 tokens")
    tokens = _byte_chars()
    # "Ġ" is the byte-level space, so filler i reads " w<i>" when detokenized.
    tokens += [f"Ġw{i}" for i in range(n_vocab - 256 - 2)]
    tokens += ["<|bos|>", "<|eos|>"]
    types = [TOKEN_NORMAL] * (n_vocab - 2) + [TOKEN_CONTROL, TOKEN_CONTROL]
    return Vocabulary(tokens=tokens, types=types, merges=["Ġ w"], bos=n_vocab - 2, eos=n_vocab - 1)
