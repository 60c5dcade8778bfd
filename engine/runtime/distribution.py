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
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])  # llama_token_data



def draw(p: np.ndarray, rng: np.random.Generator) -> int:
    """A token drawn from the probabilities ``p`` (they need not sum to exactly 1)."""
    cumulative = np.cumsum(p, dtype=np.float64)
    total = float(cumulative[-1])
    if not total > 0.0:
        raise ValueError("the distribution has no mass")
    return min(int(np.searchsorted(cumulative, rng.random() * total, side="right")), len(p) - 1)

class Cuts(NamedTuple):
    """A chain's stages that drop tokens (0 / 0.0 / 1.0: off)."""

    top_k: int = 0
    min_p: float = 0.0
    top_p: float = 1.0


NO_CUTS = Cuts()


def candidates(logits: np.ndarray, cuts: Cuts, adjusted: Sequence[int]) -> np.ndarray | None:
    """The tokens a chain can keep, found without running its stages: None for the whole row.

    The stages before the cuts (logit bias, penalties) change only the ``adjusted``
    tokens' logits (biased ones and every token the penalties remember; a superset is
    fine); every other token keeps its raw logit. With top-k, such a token that ends in
    the top ``top_k`` has fewer than ``top_k`` unadjusted tokens above it, so it is among
    the top ``top_k + len(adjusted)`` of the raw row. Without top-k but with min-p (and
    no top-p before it, whose cut depends on the whole row's mass), a token min-p keeps
    lies within ``log(min_p)`` of the largest logit, which is at least the largest
    unadjusted one. Those and the adjusted tokens are the candidates: the stages keep the
    same tokens with the same probabilities as on the whole row (up to ties at top-k's
    cut, which it breaks arbitrarily anyway), for a fraction of the cost at a real
    vocabulary (151,936 entries through every stage: 3-5 ms a row).
    """
    n_vocab, (top_k, min_p, top_p) = len(logits), cuts
    extra = np.asarray(adjusted, dtype=np.int64)
    if top_k > 0:
        reach = top_k + len(extra)
        if 4 * reach >= n_vocab:
            return None
        top = np.argpartition(logits, -reach)[-reach:]
    elif 0.0 < min_p <= 1.0 and top_p >= 1.0:
        if 4 * len(extra) >= n_vocab:
            return None
        free = logits.copy()
        free[extra] = -np.inf
        top = np.flatnonzero(free >= free.max() + np.float32(np.log(min_p)))
        if 4 * len(top) >= n_vocab:
            return None
    else:
        return None
    return np.union1d(top, extra).astype(np.int32)


class TokenRow:
    """One whole row of logits as a ``llama_token_data_array``, kept between calls."""

    def __init__(self, lib: Any, n_vocab: int) -> None:
        self._lib = lib
        self.n_vocab = n_vocab
        self._ids = np.arange(n_vocab, dtype=np.int32)
        self._data = np.zeros(n_vocab, dtype=TOKEN_DATA)
        self._array = lib.llama_token_data_array()

    def probabilities(self, stages: Sequence[Any], logits: np.ndarray, among: np.ndarray | None = None) -> np.ndarray:
        """``stages`` applied in order to ``logits`` (left untouched), then a softmax over the
        tokens they kept: a dense row of ``n_vocab`` probabilities (0 for every token cut).
        ``among``: only these tokens enter the stages (:func:`candidates`: the same result).
        A row the stages leave no finite logit (a grammar at a dead end) puts all its mass on
        the first token kept, as ``dist`` would pick it."""
        data = self._data
        size = self.n_vocab if among is None else len(among)
        ids = self._ids if among is None else among
        data["id"][:size] = ids  # a stage sorts the entries: start from the identity again
        data["logit"][:size] = logits if among is None else logits[among]
        data["p"][:size] = 0.0
        array = self._array
        array.data = ctypes.cast(data.ctypes.data, type(array.data))
        array.size, array.selected, array.sorted = size, -1, False
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

    def __init__(self, lib: Any, n_vocab: int, stages: Sequence[Any], penalties: Any, seed: int | None,
                 cuts: Cuts, adjusted: Callable[[], Sequence[int]]) -> None:
        """``stages``: the target chain's stages for ``q`` in order, ``penalties`` among them
        (cloned per round) or None. ``cuts``: the chain's top-k, min-p and top-p, and ``adjusted``:
        the tokens its bias and penalties may change, at the start of a round (:func:`candidates`)."""
        self._lib = lib
        self._cuts, self._adjusted_at_start = cuts, adjusted
        self._adjusted: set[int] = set()
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
        self._adjusted = set(self._adjusted_at_start())

    def sample(self, logits: np.ndarray) -> int:
        """A draft drawn from ``q`` of one row of the head's logits; ``q`` is kept in :attr:`rows`."""
        stages = [self._clone if s is self._penalties and self._clone is not None else s for s in self._stages]
        q = self._row.probabilities(stages, logits, candidates(logits, self._cuts, list(self._adjusted)))
        token = draw(q, self.rng)
        self.rows.append(q)
        if self._clone is not None:
            self._lib.llama_sampler_accept(self._clone, token)
            self._adjusted.add(token)  # the clone remembers it for the next draft
        return token

    def take(self) -> list[np.ndarray]:
        """The rows of the last draft (one per draft token), handed over once."""
        rows, self.rows = self.rows, []
        return rows

    def end(self) -> None:
        if self._clone is not None:
            self._lib.llama_sampler_free(self._clone)
            self._clone = None
