"""The smallest GPT-2-style vocabulary llama.cpp loads: the 256 byte-level
characters, readable filler words, then BOS and EOS as control tokens."""

from __future__ import annotations

from dataclasses import dataclass

TOKEN_NORMAL = 1
TOKEN_CONTROL = 3

# Oracle maps take part over at most this many tokens: as many as a 4,096-token vocabulary has.
# A real-sized vocabulary (151,936 tokens) keeps its full LM head and sampler costs, but its
# effective maps (engine.synth.weights.effective_map: an argmax over the vocabulary for every
# token taking part) then cost seconds instead of a vocabulary-squared product (86 GiB), and the
# heads agree with the target as often as at 4,096 tokens. The other words are ordinary tokens
# whose LM head rows are zero, so greedy decoding never reaches them.
MAX_ACTIVE = 4094


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

    first_word = 256  # tokens [first_word, n_normal) are the readable filler words

    @property
    def n_normal(self) -> int:
        """Tokens [0, n_normal) are ordinary text; the rest are control tokens."""
        return self.bos

    @property
    def n_active(self) -> int:
        """Tokens [0, n_active) take part in the oracle maps (all normal ones up to ``MAX_ACTIVE``)."""
        return min(self.n_normal, MAX_ACTIVE)


_WORDS = (
    "the of and to in is that for it as with was on be by this are from at or an have not which but "
    "all were when we there can more if will one about up out them some so what time would other into "
    "has its two like then first any new could very after most also made did many over such where "
    "through back years much before good great well must know still own see world even here under "
    "model token draft head fast slow river light stone water paper green quiet bright simple small "
    "large early later every often rarely north south east west cloud rain wind field garden market "
    "number letter signal engine window bridge forest mountain valley ocean island harbor station"
).split()
_SYLLABLES = ("ka", "lo", "mi", "ren", "to", "sa", "vi", "dor", "ne", "pa", "ru", "el", "tan", "so", "fi", "ma")


def filler_words(n: int) -> list[str]:
    """``n`` distinct readable words: common English first, then made-up ones."""
    words = list(dict.fromkeys(_WORDS))[:n]
    seen = set(words)
    i = 0
    while len(words) < n:
        # i's base-16 digits as syllables, two at least: the first 4,096 are the words small
        # vocabularies always had; real-sized ones (151,936 tokens) go on with longer words
        digits = [i % 16, (i // 16) % 16]
        rest = i // 256
        if i >= 256:
            digits.append(rest % 16)
            rest //= 16
            while rest:
                digits.append(rest % 16)
                rest //= 16
        word = "".join(_SYLLABLES[d] for d in digits)
        if word not in seen:
            words.append(word)
            seen.add(word)
        i += 1
    return words


def build_vocabulary(n_vocab: int) -> Vocabulary:
    if n_vocab < 260:
        raise ValueError("a synthetic vocabulary needs at least 260 tokens")
    tokens = _byte_chars()
    # "Ġ" is the byte-level space, so each filler reads " word" when detokenized.
    tokens += [f"Ġ{w}" for w in filler_words(n_vocab - 256 - 2)]
    tokens += ["<|bos|>", "<|eos|>"]
    types = [TOKEN_NORMAL] * (n_vocab - 2) + [TOKEN_CONTROL, TOKEN_CONTROL]
    return Vocabulary(tokens=tokens, types=types, merges=["Ġ t"], bos=n_vocab - 2, eos=n_vocab - 1)
