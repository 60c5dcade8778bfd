"""Processed distributions over the vocabulary, from llama.cpp's own sampler stages.

Rejection-sampling verification (engine/speculative/rejection.py) needs the
probabilities a sampler chain would draw from, not one drawn token: the target's
``p`` at a verify row and the drafter's ``q`` at a draft step. Both are the
chain's stages applied to a whole row of logits without its final pick
(``dist``), then a softmax over what the stages kept — what ``dist`` itself
computes before it draws. Applying llama.cpp's stages (rather than copies of
them in numpy) keeps their meaning exact: the same top-k ties, top-p and min-p
cuts, penalties and grammar as plain sampling.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import numpy as np

TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])  # llama_token_data



def draw(p: np.ndarray, rng: np.random.Generator) -> int:
    """A token drawn from the probabilities ``p`` (they need not sum to exactly 1)."""
    cumulative = np.cumsum(p, dtype=np.float64)
    total = float(cumulative[-1])
    if not total > 0.0:
        raise ValueError("the distribution has no mass")
    return min(int(np.searchsorted(cumulative, rng.random() * total, side="right")), len(p) - 1)

class TokenRow:
    """One whole row of logits as a ``llama_token_data_array``, kept between calls."""

    def __init__(self, lib: Any, n_vocab: int) -> None:
        self._lib = lib
        self.n_vocab = n_vocab
        self._ids = np.arange(n_vocab, dtype=np.int32)
        self._data = np.zeros(n_vocab, dtype=TOKEN_DATA)
        self._array = lib.llama_token_data_array()

    def probabilities(self, stages: Sequence[Any], logits: np.ndarray) -> np.ndarray:
        """``stages`` applied in order to ``logits`` (left untouched), then a softmax over the
        tokens they kept: a dense row of ``n_vocab`` probabilities (0 for every token cut).
        A row the stages leave no finite logit (a grammar at a dead end) puts all its mass on
        the first token kept, as ``dist`` would pick it."""
        data = self._data
        data["id"] = self._ids  # a stage sorts the entries: start from the identity again
        data["logit"] = logits
        data["p"] = 0.0
        array = self._array
        array.data = ctypes.cast(data.ctypes.data, type(array.data))
        array.size, array.selected, array.sorted = self.n_vocab, -1, False
        for stage in stages:
            self._lib.llama_sampler_apply(stage, ctypes.byref(array))
        size = int(array.size)
        address = ctypes.cast(array.data, ctypes.c_void_p).value
        kept = data[:size] if address == data.ctypes.data else np.frombuffer(
            (ctypes.c_byte * (size * TOKEN_DATA.itemsize)).from_address(address or 0), dtype=TOKEN_DATA)
        probs = np.zeros(self.n_vocab, dtype=np.float64)
        if size == 0:
            raise ValueError("the sampler stages kept no token")
        values = kept["logit"].astype(np.float64)
        top = float(values.max())
        if not np.isfinite(top):
            probs[int(kept["id"][0])] = 1.0
            return probs
        weights = np.exp(values - top)
        probs[kept["id"]] = weights / weights.sum()
        return probs


class DraftSampler:
    """Samples a drafter's tokens from its processed distribution ``q``, and keeps each ``q``.

    ``q`` is the head's logits through the request's own stages: logit bias, the
    penalties, top-k, top-p, min-p and temperature. The penalties apply to ``q``
    because they apply to ``p``: the closer ``q`` is to ``p``, the more drafts are
    accepted (``Σ min(p, q)``), and a draft the target penalises should be drafted
    less. Their history is a clone of the target's penalty stage taken at the start
    of each round, into which each draft is accepted as it is drafted: at draft k
    it holds the emitted tokens and drafts 0..k-1, exactly the history the target's
    chain will have at that row if those drafts are accepted. The grammar is not a
    stage of ``q`` (checking every token's text per draft step costs what a whole
    target row costs): a sampled draft the grammar forbids is kept as the round's
    last draft, and the target, which gives it no probability, rejects it. Any
    ``q`` keeps the output distribution exact; these choices only decide acceptance.

    One random generator serves the drafts and the target's verification; a seeded
    request seeds it, so its reply is reproducible (but not the plain reply).
    """

    def __init__(self, lib: Any, n_vocab: int, stages: Sequence[Any], penalties: Any, seed: int | None) -> None:
        """``stages``: the target chain's stages for ``q`` in order, ``penalties`` among them
        (cloned per round) or None."""
        self._lib = lib
        self._stages = list(stages)
        self._penalties = penalties
        self._clone: Any = None
        self._row = TokenRow(lib, n_vocab)
        self.rng = np.random.default_rng(seed)
        self.rows: list[np.ndarray] = []  # this round's q, one per sampled draft

    def start(self) -> None:
        """Begin a round: forget the last round's rows, clone the penalties' history."""
        self.end()
        self.rows = []
        if self._penalties is not None:
            self._clone = self._lib.llama_sampler_clone(self._penalties)

    def sample(self, logits: np.ndarray) -> int:
        """A draft drawn from ``q`` of one row of the head's logits; ``q`` is kept in :attr:`rows`."""
        stages = [self._clone if s is self._penalties and self._clone is not None else s for s in self._stages]
        q = self._row.probabilities(stages, logits)
        token = draw(q, self.rng)
        self.rows.append(q)
        if self._clone is not None:
            self._lib.llama_sampler_accept(self._clone, token)
        return token

    def take(self) -> list[np.ndarray]:
        """The rows of the last draft (one per draft token), handed over once."""
        rows, self.rows = self.rows, []
        return rows

    def end(self) -> None:
        if self._clone is not None:
            self._lib.llama_sampler_free(self._clone)
            self._clone = None
