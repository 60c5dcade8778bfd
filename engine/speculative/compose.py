"""MTP and n-gram drafting in one generation (mode ``"mtp+ngram"``).

Policy, per round (documented in docs/mtp.md, "n-gram drafting, and MTP + n-gram"):

1. Ask the n-gram drafter first: it costs microseconds.
2. Use its draft only when the match behind it is long (at least
   :data:`TRUST_MATCH` tokens, or the whole ``ngram_max``) **and** the
   n-gram source's recent yield is at least MTP's: yield is a decaying
   average of tokens accepted per round (``ngram.DECAY``). MTP then does not
   draft at all this round, and its catch-up waits (:data:`DEFER_CATCH_UP`):
   a run of n-gram rounds costs no MTP decode.
3. Otherwise MTP drafts.

Why not "the longer draft": n-gram drafts are often long and wrong on
generative text, and a long wrong draft displaces a shorter right MTP draft
(users of llama.cpp's n-gram drafters report exactly this). The yield test
keeps the n-gram source out of text it does not predict and lets it in where
it does; both yields start equal, so the first long match is tried.

The n-gram yield learns even on rounds MTP drafted: the n-gram draft that
was not sent is scored against the tokens the target then produces
(:class:`~engine.speculative.ngram.Yield`), so the n-gram source can come
back once the text turns repetitive. The n-gram drafter's own gate (for mode
``"ngram"``) is not used here: this policy replaces it.

Prefix reuse (engine/generation/prefix_cache.py) treats the composition as
its MTP half: that half never catches up lazily, and a reply's deferred
backlog is decoded as it ends, so its context holds exact rows for what the
target kept and a next prompt keeps them as with MTP alone (:meth:`begin`'s
``keep``, :meth:`resume`); the n-gram half reads the reused tokens
(:meth:`read_reused`); engine/speculative/reuse.py says so for the engine.

``n_max`` is MTP's depth (limited to what the model's heads can draft,
``deepest``). A trusted n-gram draft may run to :data:`MAX_DRAFT` tokens:
it is only sent when its source has been right recently, and a long copied
run is where n-gram drafting gains most.
"""

from __future__ import annotations

from dataclasses import replace

from engine.runtime import Context
from engine.runtime.distribution import DraftSampler
from engine.speculative.draft_penalties import DraftPenalties
from engine.speculative.mtp import MTPDrafter
from engine.speculative.ngram import NgramDrafter, Yield
from engine.speculative.settings import MAX_DRAFT, MTP, SPECULATION_OFF, SpeculativeSettings

TRUST_MATCH = 3  # the shortest n-gram match whose draft may displace MTP's
# Defer MTP's catch-up even where it cannot fold: n-gram rounds then cost no
# MTP decode, and the backlog is caught up in one batch before MTP drafts.
DEFER_CATCH_UP = True
# Settle MTP's deferred catch-up before it outgrows this share of a batch.
BACKLOG_SHARE = 0.5


class ComposeDrafter:
    """One drafter over an :class:`MTPDrafter` and an :class:`NgramDrafter` (see the module docstring)."""

    def __init__(self, mtp: MTPDrafter, ngram: NgramDrafter, deepest: int) -> None:
        self.mtp, self.ngram, self.deepest = mtp, ngram, deepest
        self.n_heads, self.chained = mtp.n_heads, mtp.chained
        self.source = mtp.source
        self.settings = SPECULATION_OFF
        # the composition drafts unguided and without margins (as its n-gram half must); no shadow probes
        self.shadow_probes = False
        self.guide = None
        self.draft_margins: list[float] | None = None
        self.yields = {"mtp": Yield(), "ngram": Yield()}  # decaying accepted tokens per round (ngram.Yield)
        self._sent: list[int] = []
        self._max_backlog = max(1, int(BACKLOG_SHARE * mtp.batch.capacity))

    @property
    def draft_sampler(self) -> DraftSampler | None:
        """Probabilistic draft sampling applies to MTP's rounds; n-gram rounds' drafts match."""
        return self.mtp.draft_sampler

    @draft_sampler.setter
    def draft_sampler(self, value: DraftSampler | None) -> None:
        self.mtp.draft_sampler = value

    @property
    def penalties(self) -> DraftPenalties | None:
        """The request's repetition penalties on MTP's rows (n-gram drafts are copied text)."""
        return self.mtp.penalties

    @penalties.setter
    def penalties(self, value: DraftPenalties | None) -> None:
        self.mtp.penalties = value

    @property
    def seconds(self) -> dict[str, float]:
        return {k: self.mtp.seconds[k] + self.ngram.seconds[k] for k in ("draft", "catch_up")}

    @property
    def ctx(self) -> Context:
        """The MTP half's context (what prefix reuse keeps rows of)."""
        return self.mtp.ctx

    @property
    def exact_end(self) -> int:
        """Positions [0, exact_end) of the MTP half's context hold exact rows (:attr:`MTPDrafter.exact_end`)."""
        return self.mtp.exact_end

    def begin(self, settings: SpeculativeSettings, keep: int = 0) -> None:
        """Start a generation; ``keep``: the MTP half's leading rows still exact for this prompt (prefix
        reuse, :meth:`MTPDrafter.begin`). The n-gram half reads the reused tokens with :meth:`read_reused`."""
        self.settings = settings
        self.ngram.begin(replace(settings, n_max=MAX_DRAFT))
        self.mtp.begin(replace(settings, mode=MTP, n_max=max(1, min(settings.n_max, self.deepest))), keep=keep)
        self.mtp.defer = DEFER_CATCH_UP
        self.mtp.lazy = False  # it settles its own backlog as the sources take turns
        start = float(min(settings.n_max, self.deepest)) / 2
        self.yields = {"mtp": Yield(start), "ngram": Yield(start)}
        self._sent = []

    def process(self, tokens: list[int], pos_start: int, row0: int = 0) -> None:
        self.mtp.process(tokens, pos_start, row0)
        self.ngram.process(tokens, pos_start)

    def read_reused(self, tokens: list[int]) -> None:
        """The prompt's first ``tokens`` were reused from the last generation: the n-gram half reads them
        (the MTP half kept its rows for them)."""
        self.ngram.process(tokens, 0)

    def resume(self, tokens: list[int], pos_start: int, row0: int = 0) -> None:
        """The first prefill chunk after a reused prefix (:meth:`MTPDrafter.resume`)."""
        self.mtp.resume(tokens, pos_start, row0)
        self.ngram.process(tokens, pos_start)

    def verified(self, tokens: list[int], pos_start: int, row0: int = 0) -> None:
        self.mtp.verified(tokens, pos_start, row0)
        self.ngram.verified(tokens, pos_start)

    def accept(self, n_accepted: int, pos0: int) -> None:
        self.mtp.accept(n_accepted, pos0)
        self.ngram.accept(n_accepted, pos0)
        if self._sent:
            self.yields[self.source].learn(n_accepted)
            self._sent = []

    def draft(self, id_last: int, pos0: int, room: int) -> list[int]:
        ngram_yield = self.yields["ngram"]
        ngram_yield.score_held(self.ngram.context, pos0, id_last)
        candidate = self.ngram.propose(id_last, pos0, room)
        long_match = self.ngram.last_match >= min(TRUST_MATCH, self.settings.ngram_max)
        if candidate and long_match and ngram_yield.value >= self.yields["mtp"].value:
            self.source = self.ngram.source
            if self.mtp.backlog + len(candidate) + 1 > self._max_backlog:
                self.mtp.settle()
            self._sent = candidate
            return candidate
        self.source = self.mtp.source
        self._sent = self.mtp.draft(id_last, pos0, room)
        if candidate:
            ngram_yield.hold(candidate, pos0)
        return self._sent

    def close(self) -> None:
        self.ngram.close()  # the MTP drafter belongs to the session
