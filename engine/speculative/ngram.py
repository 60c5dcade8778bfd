"""n-gram drafting: propose what followed the same tokens before.

Text that repeats what is already there (code edits, summaries that quote,
a small model's loops, a regenerated reply) can be drafted for free, with no
draft model and no MTP head. Two sources, tried in this order:

1. **Prompt lookup** over the current context (prompt and accepted tokens):
   find earlier places where the last ``n`` tokens (ending with ``id_last``)
   occurred, longest ``n`` first (``ngram_max`` down to ``ngram_min``), and
   propose what followed the most recent of the longest matches, as
   llama.cpp's ``ngram-simple`` does with one fixed ``n``. One vectorised pass
   over the context per draft (microseconds at tens of thousands of tokens).
2. A **persistent n-gram map** over the conversation (:class:`NgramMap`),
   used when it holds a longer match than the context:
   every n-gram of every context this worker drafted in (``ngram_min`` to
   ``ngram_max`` tokens) -> where its last occurrence ended in an append-only
   history. It outlives one generation, so a regenerated or edited reply can
   copy the previous one, and an earlier turn that left the context window
   still drafts. Constant work per token (one dict write per n), bounded in
   size (:data:`MAP_CAPACITY` tokens of history; past that the older half is
   dropped); each reply feeds it only what is new since the previous
   context (``NgramDrafter._sync_map``). It is cleared when a prompt does
   not continue the previous context (another conversation), and belongs to
   one loaded model: a new model gets a new drafter.

A gate keeps short matches out of text they do not predict
(:class:`NgramDrafter`, docs/mtp.md). Drafts never change the output: the
target verifies every drafted token with its own sampler
(engine/generation/generator.py), as it does MTP drafts.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np

from engine.speculative.settings import SPECULATION_OFF, SpeculativeSettings

if TYPE_CHECKING:
    from engine.runtime.distribution import DraftSampler

SOURCE = "ngram"
# history tokens the persistent map keeps (4 bytes each, plus one dict entry per distinct n-gram)
MAP_CAPACITY = 1 << 20
# prompt lookup checks at most this many of the most recent places id_last occurred
MAX_CANDIDATES = 4096
_BREAK = -1  # history separator between contexts: no key spans it, no draft copies it
# The gate (NgramDrafter.draft): a match this long is sent whatever the recent yield ...
LONG_MATCH = 4
# ... a shorter one only while drafts have recently yielded this many accepted tokens a round.
YIELD_MIN = 2.0
YIELD_START = 2.0  # optimistic: the first drafts are tried
DECAY = 0.8  # weight of the past in a yield (about the last five rounds count)


def prompt_lookup(context: np.ndarray, n: int, id_last: int, ngram_min: int, ngram_max: int,
                  k: int) -> tuple[list[int], int]:
    """Up to ``k`` tokens that followed the longest earlier match of the context's tail.

    The tail is ``context[:n]`` followed by ``id_last``. A match of length m
    at j means ``context[j-m+1 .. j]`` equals the tail's last m tokens;
    matches of at least ``ngram_min`` count, and the longest (capped at
    ``ngram_max``) wins, the most recent among equals. Returns the draft and
    the match length (0 and an empty draft when nothing matched).
    """
    if k <= 0 or n <= 0:
        return [], 0
    ctx = context[:n]
    cand = np.flatnonzero(ctx == id_last)[-MAX_CANDIDATES:]
    if cand.size == 0:
        return [], 0
    length = np.ones(cand.size, dtype=np.int64)
    alive = np.ones(cand.size, dtype=bool)
    for d in range(1, min(ngram_max, n)):
        idx = cand - d
        ok = alive & (idx >= 0)
        ok[ok] = ctx[idx[ok]] == ctx[n - d]
        if not ok.any():
            break
        length += ok
        alive = ok
    best = int(length.max())
    if best < ngram_min:
        return [], 0
    j = int(cand[np.flatnonzero(length == best)[-1]])
    # What followed position j: the context up to id_last, and past it the
    # same again (the tail repeats with period n - j, as a loop does).
    period = [int(t) for t in ctx[j + 1: j + 1 + k]]
    if len(period) < k:
        period.append(int(id_last))
    return [period[i % len(period)] for i in range(k)], best


class NgramMap:
    """n-gram -> where its most recent occurrence ended, over an append-only history.

    ``extend`` costs ``ngram_max - ngram_min + 1`` dict writes per token;
    ``lookup`` up to as many dict reads. When the history passes ``capacity``
    tokens its older half is dropped and the index rebuilt from the rest
    (amortised constant per token).
    """

    def __init__(self, ngram_min: int, ngram_max: int, capacity: int = MAP_CAPACITY) -> None:
        self.ngram_min, self.ngram_max, self.capacity = ngram_min, ngram_max, capacity
        self.history: list[int] = []
        self.index: dict[tuple[int, ...], int] = {}
        self._tail: list[int] = []  # the last ngram_max tokens since the last break

    def __len__(self) -> int:
        return len(self.history)

    def clear(self) -> None:
        self.history, self.index, self._tail = [], {}, []

    def reshape(self, ngram_min: int, ngram_max: int) -> None:
        """Other n-gram sizes: the index is rebuilt for them (a settings change between replies)."""
        if (ngram_min, ngram_max) == (self.ngram_min, self.ngram_max):
            return
        self.ngram_min, self.ngram_max = ngram_min, ngram_max
        self._rebuild(self.history)

    def break_segment(self) -> None:
        """Start a new context: no n-gram spans the break and no draft copies across it."""
        if self.history and self.history[-1] != _BREAK:
            self.history.append(_BREAK)
        self._tail = []

    def extend(self, tokens: list[int] | np.ndarray) -> None:
        lo, hi = self.ngram_min, self.ngram_max
        history, index, tail = self.history, self.index, self._tail
        for tok in tokens:
            tok = int(tok)
            history.append(tok)
            tail.append(tok)
            if len(tail) > hi:
                del tail[0]
            end = len(history)
            for n in range(lo, min(hi, len(tail)) + 1):
                index[tuple(tail[-n:])] = end
        if len(history) > self.capacity:
            self._rebuild(history[len(history) - self.capacity // 2:])

    def lookup(self, tail: list[int], k: int) -> tuple[list[int], int]:
        """What followed the longest n-gram ending ``tail`` (up to ``k`` tokens), and its length."""
        for n in range(min(self.ngram_max, len(tail)), self.ngram_min - 1, -1):
            end = self.index.get(tuple(tail[-n:]))
            if end is None or end >= len(self.history):
                continue
            draft = self.history[end:end + k]
            if _BREAK in draft:
                draft = draft[:draft.index(_BREAK)]
            if draft:
                return draft, n
        return [], 0

    def _rebuild(self, kept: list[int]) -> None:
        self.history, self.index, self._tail = [], {}, []
        start = 0
        for i, tok in enumerate([*kept, _BREAK]):
            if tok == _BREAK:
                self.extend(kept[start:i])
                if i < len(kept):
                    self.break_segment()
                start = i + 1


class Yield:
    """A source's recent yield: a decaying average of draft tokens accepted per
    round, learnt from drafts sent and from drafts held back (scored against
    what the target produced; a lower bound, as tokens past those are unknown)."""

    def __init__(self, start: float = 0.0) -> None:
        self.value = start
        self._held: list[int] = []
        self._held_pos = 0

    def learn(self, accepted: int) -> None:
        self.value = DECAY * self.value + (1 - DECAY) * accepted

    def hold(self, candidate: list[int], pos0: int) -> None:
        """A draft not sent at ``pos0``: scored as the target's tokens arrive
        (one held draft at a time: a newer one waits until it is scored)."""
        if not self._held:
            self._held, self._held_pos = candidate, pos0

    def score_held(self, context: np.ndarray, pos0: int, id_last: int) -> None:
        """Score the held draft against the tokens produced since it was made:
        ``context[held_pos + 1 : pos0]`` and then ``id_last``. While every
        token so far is as drafted, it waits for more."""
        if not self._held:
            return
        produced = [int(t) for t in context[self._held_pos + 1:pos0]] + [id_last]
        hits = 0
        for drafted, actual in zip(self._held, produced, strict=False):
            if drafted != actual:
                break
            hits += 1
        if hits == len(produced) < len(self._held):
            return
        self.learn(hits)
        self._held = []


class NgramDrafter:
    """Drafts from prompt lookup, then from the persistent map (see the module docstring).

    Follows the :class:`~engine.speculative.drafter.Drafter` interface; it
    keeps its own copy of the context from ``process`` (prompt chunks) and
    ``verified``/``accept`` (each verify's kept rows).

    The gate: a draft is sent when its match is long (:data:`LONG_MATCH`
    tokens, or ``ngram_max``) or the source's recent yield is at least
    :data:`YIELD_MIN` tokens a round; otherwise it is held back and scored
    (:class:`Yield`), so drafting resumes when the text turns repetitive.
    On generative text a short match is mostly wrong, and a wrong draft costs
    a verify batch of several rows. :meth:`propose` is the ungated lookup the
    composition drafter uses; ``last_match`` is the match length behind it.
    """

    source = SOURCE
    n_heads = 0
    chained = False
    shadow_probes = False  # adaptive depth verifies its probes: a shadow probe pays where a draft costs a decode

    def __init__(self, capacity: int = MAP_CAPACITY) -> None:
        self.settings = SPECULATION_OFF
        self.guide = None  # drafts are copied text: a grammar is not consulted (the target rejects what breaks it)
        self.draft_margins: list[float] | None = None
        self.penalties = None  # copied text is not re-ranked by the request's penalties
        self.draft_sampler: DraftSampler | None = None  # copied text is not sampled: its drafts match
        self.map = NgramMap(SPECULATION_OFF.ngram_min, SPECULATION_OFF.ngram_max, capacity)
        self.seconds = {"draft": 0.0, "catch_up": 0.0}
        self.last_match = 0
        self.yield_ = Yield(YIELD_START)
        self._sent = False
        self._ctx = np.zeros(4096, dtype=np.int32)
        self._n = 0
        self._fed = 0  # context tokens already in the map
        self._previous = np.zeros(0, dtype=np.int32)  # the last generation's context
        self._previous_in_map = False
        self._checked = False
        self._verified: list[int] = []

    @property
    def context(self) -> np.ndarray:
        """The context so far (prompt and accepted tokens; ``id_last`` not yet in it)."""
        return self._ctx[:self._n]

    # -- Drafter interface --------------------------------------------------
    def begin(self, settings: SpeculativeSettings) -> None:
        self.settings = settings
        self.map.reshape(settings.ngram_min, settings.ngram_max)
        if self._n:
            self._previous = self._ctx[:self._n].copy()
            if self._checked and self._fed < self._n:  # the last reply's tail, accepted after its last draft
                self.map.extend(self._ctx[self._fed:self._n])
            self._previous_in_map = self._checked  # the map's history ends with that whole context
        self._n = self._fed = 0
        self._checked = False
        self.last_match = 0
        self.yield_ = Yield(YIELD_START)
        self._sent = False
        self.seconds = {"draft": 0.0, "catch_up": 0.0}

    def process(self, tokens: list[int], pos_start: int, row0: int = 0) -> None:
        self._put(pos_start, tokens)

    def verified(self, tokens: list[int], pos_start: int, row0: int = 0) -> None:
        self._verified = list(tokens)

    def accept(self, n_accepted: int, pos0: int) -> None:
        self._put(pos0, self._verified[:n_accepted + 1])
        if self._sent:
            self.yield_.learn(n_accepted)
            self._sent = False

    def draft(self, id_last: int, pos0: int, room: int) -> list[int]:
        self.yield_.score_held(self.context, pos0, id_last)
        drafts = self.propose(id_last, pos0, room)
        long_match = self.last_match >= min(LONG_MATCH, self.settings.ngram_max)
        if drafts and not long_match and self.yield_.value < YIELD_MIN:
            self.yield_.hold(drafts, pos0)
            return []
        self._sent = bool(drafts)
        return drafts

    def propose(self, id_last: int, pos0: int, room: int) -> list[int]:
        """The ungated draft: up to ``min(n_max, room)`` tokens after ``id_last``
        at ``pos0`` (at least ``n_min``, else none); sets ``last_match``."""
        t0 = time.perf_counter()
        s = self.settings
        k = min(s.n_max, room)
        self._n = min(self._n, pos0)
        self._sync_map()
        drafts, match = prompt_lookup(self._ctx, self._n, id_last, s.ngram_min, s.ngram_max, k)
        if match < s.ngram_max and k > 0:  # a longer match in the conversation's history wins
            tail = [int(t) for t in self._ctx[max(0, self._n - s.ngram_max + 1):self._n]] + [id_last]
            older, older_match = self.map.lookup(tail, k)
            if older_match > match:
                drafts, match = older, older_match
        if len(drafts) < max(1, s.n_min):
            drafts, match = [], 0
        self.last_match = match
        self.seconds["draft"] += time.perf_counter() - t0
        return drafts

    def forget(self) -> None:
        """Drop the map and the previous context: the next generation drafts from its own context only
        (a benchmark measuring a first reply, not a regenerated one)."""
        self.map.clear()
        self._n = self._fed = 0
        self._previous = np.zeros(0, dtype=np.int32)
        self._previous_in_map = False

    def close(self) -> None:
        self.map.clear()

    # -- context -------------------------------------------------------------
    def _put(self, pos: int, tokens: list[int]) -> None:
        end = pos + len(tokens)
        if end > self._ctx.shape[0]:
            grown = np.zeros(max(end, 2 * self._ctx.shape[0]), dtype=np.int32)
            grown[:self._n] = self._ctx[:self._n]
            self._ctx = grown
        self._ctx[pos:end] = tokens
        self._n = end
        self._fed = min(self._fed, pos)

    def _sync_map(self) -> None:
        """Feed the map what the context gained since the last draft.

        On a generation's first draft, compare this prompt with the previous
        context, which the map's history ends with: a prompt that continues it
        (the next turn) carries on the same segment with only the new tokens;
        one that shares a prefix (an edit, a regenerated reply) starts a new
        segment from just before the point where they part (so n-grams across
        it exist), the prefix's n-grams still pointing at the old continuation;
        one that shares little (another conversation) forgets the map. So a
        reply feeds the map what is new, not the whole conversation again.
        """
        if not self._checked:
            self._checked = True
            prev = self._previous
            n = min(prev.shape[0], self._n)
            differs = np.flatnonzero(prev[:n] != self._ctx[:n])
            shared = int(differs[0]) if differs.size else n
            if prev.shape[0] and shared < n // 2:
                self.map.clear()  # and the whole context is fed below
            elif self._previous_in_map and shared and shared == prev.shape[0]:
                self._fed = max(self._fed, shared)
            else:
                self.map.break_segment()
                if self._previous_in_map and shared:
                    self._fed = max(self._fed, shared - (self.map.ngram_max - 1))
        if self._fed < self._n:
            self.map.extend(self._ctx[self._fed:self._n])
            self._fed = self._n
