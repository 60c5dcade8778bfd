"""A llama.cpp sampler chain built from a request's sampling settings.

The chain is stateful: the penalties remember the tokens it accepted. The
order of the stages is llama.cpp's default (``common_sampler``: logit bias,
penalties, then top-k, top-p, min-p, temperature, and the final pick), so a
setting brought from a llama.cpp command line means the same here.

A grammar (GBNF, or a JSON schema converted by llama-cpp-python's
``json_schema_to_gbnf``) is a stage of the same chain, right after the logit
bias: it masks every token the grammar cannot take next, and accepting a
token advances it. The decode loop samples verify rows in order and stops at
the first rejected draft, so the grammar only ever advances over emitted
tokens: with speculation it needs no rollback, a draft that breaks the
grammar is simply rejected, and the output is the same as without drafting.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from engine.errors import GrammarError
from engine.runtime import native
from engine.runtime.distribution import NO_CUTS, Cuts, DraftSampler, TokenRow, candidates
from engine.sampling import RANDOM_SEED, SamplingParams

__all__ = ["Sampler", "SamplingParams"]


class Sampler:
    """Owns a ``llama_sampler`` chain; :meth:`sample` also accepts the token.

    Accepting is what feeds the penalties' history, so a caller must sample
    exactly the tokens it emits, in order (the MTP loop samples verify rows
    only up to the first rejected draft), and call :meth:`accept_prompt`
    once before the first sample.
    """

    def __init__(self, params: SamplingParams, n_vocab: int = 0, n_ctx: int = 0, *, vocab: Any = None,
                 grammar: str | None = None, grammar_triggers: Sequence[str] = (), grammar_root: str = "root",
                 logit_bias: dict[int, float] | None = None) -> None:
        """``grammar`` (GBNF, root rule ``root``) needs the model's ``vocab``; with
        ``grammar_triggers`` (regular expressions) it is *lazy*: the output is free until one of
        them matches, and the grammar holds from the match on. ``logit_bias`` maps token ids to
        what is added to their logits (-inf bans a token).

        Raises:
            GrammarError: llama.cpp cannot parse the grammar.
        """
        lib = native.llama()
        self._lib = lib
        self.params = params
        self.n_vocab = n_vocab
        self.history = params.history_length(n_ctx)
        chain = lib.llama_sampler_chain_init(lib.llama_sampler_chain_default_params())
        self.handle = chain  # freed by close() whatever fails below
        # every stage but the final pick, in order: the chain owns them, the handles stay valid
        self._stages: list[Any] = []

        def add(stage: Any) -> Any:
            lib.llama_sampler_chain_add(chain, stage)
            self._stages.append(stage)
            return stage

        self._grammar = None
        self._bias = None
        if logit_bias:
            entries = (lib.llama_logit_bias * len(logit_bias))()
            for entry, (token, bias) in zip(entries, sorted(logit_bias.items()), strict=True):
                entry.token, entry.bias = token, bias
            self._bias = add(lib.llama_sampler_init_logit_bias(n_vocab, len(entries), entries))
        if grammar is not None:
            if grammar_triggers:
                patterns = (ctypes.c_char_p * len(grammar_triggers))(*(t.encode("utf-8") for t in grammar_triggers))
                stage = lib.llama_sampler_init_grammar_lazy_patterns(
                    vocab, grammar.encode("utf-8"), grammar_root.encode(), patterns, len(grammar_triggers), None, 0)
            else:
                stage = lib.llama_sampler_init_grammar(vocab, grammar.encode("utf-8"), grammar_root.encode())
            if not stage:
                detail = "; ".join(native.recent_log(3)) or "no message from llama.cpp"
                self.close()
                raise GrammarError(f"The grammar could not be parsed: {detail}")
            self._grammar = add(stage)
        self._penalties = None
        if self.history:
            self._penalties = add(lib.llama_sampler_init_penalties(
                n_vocab, self.history, params.repeat_penalty, params.frequency_penalty, params.presence_penalty))
        self._shaping: list[Any] = []  # top-k, top-p, min-p, temperature
        if params.greedy:
            lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_greedy())
        else:
            if params.top_k > 0:
                self._shaping.append(add(lib.llama_sampler_init_top_k(params.top_k)))
            if params.top_p < 1.0:
                self._shaping.append(add(lib.llama_sampler_init_top_p(params.top_p, 1)))
            if params.min_p > 0.0:
                self._shaping.append(add(lib.llama_sampler_init_min_p(params.min_p, 1)))
            self._shaping.append(add(lib.llama_sampler_init_temp(params.temperature)))
            lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_dist(params.seed & 0xFFFFFFFF))
        self._row: TokenRow | None = None
        self.handle = chain
        # what the stages before top-k may change (distribution.candidates): the biased tokens and every
        # token the penalties may remember (a superset: all it ever accepted)
        self._cuts = NO_CUTS if params.greedy else Cuts(params.top_k, params.min_p, params.top_p)
        self._biased = sorted(logit_bias) if logit_bias else []
        self._remembered: set[int] = set()
        # greedy with nothing before the pick: the largest logit, lowest id on ties (what llama.cpp's
        # greedy stage picks), read off the row in numpy instead of a 151,936-entry pass through the chain
        self._argmax = params.greedy and not self.history and self._bias is None and self._grammar is None \
            and n_vocab > 0

    def _adjusted(self) -> list[int]:
        return [*self._biased, *self._remembered]  # candidates() sorts and drops duplicates

    def accept_prompt(self, tokens: Sequence[int]) -> None:
        """Put the prompt into the penalties' history, as llama.cpp does before
        the first sample; only its last ``history`` tokens can matter."""
        if not self.history:
            return
        # the penalties' stage only: a grammar in the chain must not read the prompt as output
        for tok in tokens[-self.history:]:
            self._lib.llama_sampler_accept(self._penalties, int(tok))
            self._remembered.add(int(tok))

    def draft_guide(self) -> DraftGuide | None:
        """A guide that keeps drafts inside the grammar, or None without one."""
        return DraftGuide(self._lib, self._grammar) if self._grammar is not None else None

    def sample(self, ctx_handle: Any, row: int) -> int:
        if self._argmax:  # a chain with no state: nothing to accept
            return int(np.ctypeslib.as_array(self._lib.llama_get_logits_ith(ctx_handle, row), shape=(self.n_vocab,))
                       .argmax())
        token = int(self._lib.llama_sampler_sample(self.handle, ctx_handle, row))  # accepts it too
        if self.history:
            self._remembered.add(token)
        return token

    def distribution(self, logits: np.ndarray) -> np.ndarray:
        """The probabilities :meth:`sample` would draw from for this row of logits: every stage
        (bias, grammar, penalties, top-k/p, min-p, temperature) without the final pick; nothing is
        accepted. For a sampling chain (temperature > 0)."""
        if self._row is None:
            self._row = TokenRow(self._lib, len(logits))
        # a grammar may cut every candidate and leave tokens further down: it needs the whole row
        among = None if self._grammar is not None else candidates(logits, self._cuts, self._adjusted())
        return self._row.probabilities(self._stages, logits, among)

    def accept(self, token: int) -> None:
        """Take ``token`` as the next emitted one (penalties' history, grammar), as :meth:`sample`
        does for the token it draws; for a token chosen from :meth:`distribution`."""
        self._lib.llama_sampler_accept(self.handle, int(token))
        if self.history:
            self._remembered.add(int(token))

    def draft_sampler(self) -> DraftSampler:
        """A drafter's sampler over this request's stages (not the grammar; see DraftSampler), seeded
        from the request's seed (a fresh one for a random seed)."""
        stages = [s for s in (self._bias, self._penalties) if s is not None] + self._shaping
        seed = None if self.params.seed == RANDOM_SEED else self.params.seed
        return DraftSampler(self._lib, self.n_vocab, stages, self._penalties, seed, self._cuts, self._adjusted)

    def close(self) -> None:
        if getattr(self, "handle", None):
            self._lib.llama_sampler_free(self.handle)
            self.handle = None


class DraftGuide:
    """Keeps a round's drafts inside the request's grammar.

    A drafter proposes as if unconstrained, so under a grammar most of its
    drafts would be rejected (a head has no idea a JSON schema is in force).
    Each round the guide clones the grammar's state after the emitted tokens;
    the drafter offers its likeliest candidates and drafts the first the
    grammar allows, and the clone advances with it. Drafts only ever propose:
    the target's own chain still decides every token, so the guide changes
    acceptance and cost, never the output.
    """

    def __init__(self, lib: Any, grammar: Any) -> None:
        self._lib = lib
        self._grammar = grammar
        self._clone: Any = None
        self._array = lib.llama_token_data_array()
        self._data: Any = None
        self._all: np.ndarray | None = None  # the whole row as llama_token_data, kept between steps

    def start(self) -> None:
        """Begin a round from the grammar's state after the last emitted token."""
        self.end()
        self._clone = self._lib.llama_sampler_clone(self._grammar)

    def choose(self, candidates: Sequence[int]) -> int | None:
        """The first of ``candidates`` (likeliest first) the grammar allows next, accepted into the
        round's state; None when it allows none of them (drafting stops there)."""
        if self._clone is None or not candidates:
            return None
        lib, n = self._lib, len(candidates)
        if self._data is None or len(self._data) < n:
            self._data = (lib.llama_token_data * n)()
        for entry, token in zip(self._data, candidates, strict=False):
            entry.id, entry.logit, entry.p = int(token), 0.0, 0.0
        self._array.data = ctypes.cast(self._data, type(self._array.data))
        self._array.size, self._array.selected, self._array.sorted = n, -1, False
        lib.llama_sampler_apply(self._clone, ctypes.byref(self._array))
        for k in range(n):
            if math.isfinite(self._array.data[k].logit):
                token = int(self._array.data[k].id)
                lib.llama_sampler_accept(self._clone, token)
                return token
        return None

    def best(self, logits: np.ndarray) -> int | None:
        """The likeliest token of a whole row the grammar allows (ties to the lower id, as greedy
        breaks them), accepted into the round's state; None when it allows none. It costs what
        the target's own grammar stage costs per sampled row: every token's text is checked."""
        if self._clone is None:
            return None
        n = len(logits)
        if self._all is None or len(self._all) != n:
            self._all = np.zeros(n, dtype=[("id", np.int32), ("logit", np.float32), ("p", np.float32)])
            self._all["id"] = np.arange(n, dtype=np.int32)
        self._all["logit"] = logits
        array = self._lib.llama_token_data_array()
        array.data = ctypes.cast(self._all.ctypes.data, type(array.data))
        array.size, array.selected, array.sorted = n, -1, False
        self._lib.llama_sampler_apply(self._clone, ctypes.byref(array))
        masked = self._all["logit"]
        token = int(masked.argmax())
        if not math.isfinite(float(masked[token])):
            return None
        self._lib.llama_sampler_accept(self._clone, token)
        return token

    def end(self) -> None:
        if self._clone is not None:
            self._lib.llama_sampler_free(self._clone)
            self._clone = None
