"""A llama.cpp sampler chain built from a request's sampling settings.

The chain is stateful: the penalties remember the tokens it accepted. The
order of the stages is llama.cpp's default (``common_sampler``: penalties,
then top-k, top-p, min-p, temperature, and the final pick), so a setting
brought from a llama.cpp command line means the same here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from engine.runtime import native
from engine.sampling import SamplingParams

__all__ = ["Sampler", "SamplingParams"]


class Sampler:
    """Owns a ``llama_sampler`` chain; :meth:`sample` also accepts the token.

    Accepting is what feeds the penalties' history, so a caller must sample
    exactly the tokens it emits, in order (the MTP loop samples verify rows
    only up to the first rejected draft), and call :meth:`accept_prompt`
    once before the first sample.
    """

    def __init__(self, params: SamplingParams, n_vocab: int = 0, n_ctx: int = 0) -> None:
        lib = native.llama()
        self._lib = lib
        self.params = params
        self.history = params.history_length(n_ctx)
        chain = lib.llama_sampler_chain_init(lib.llama_sampler_chain_default_params())
        if self.history:
            lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_penalties(
                n_vocab, self.history, params.repeat_penalty, params.frequency_penalty, params.presence_penalty))
        if params.greedy:
            lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_greedy())
        else:
            if params.top_k > 0:
                lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_top_k(params.top_k))
            if params.top_p < 1.0:
                lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_top_p(params.top_p, 1))
            if params.min_p > 0.0:
                lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_min_p(params.min_p, 1))
            lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_temp(params.temperature))
            lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_dist(params.seed & 0xFFFFFFFF))
        self.handle = chain

    def accept_prompt(self, tokens: Sequence[int]) -> None:
        """Put the prompt into the penalties' history, as llama.cpp does before
        the first sample; only its last ``history`` tokens can matter."""
        if not self.history:
            return
        for tok in tokens[-self.history:]:
            self._lib.llama_sampler_accept(self.handle, int(tok))

    def sample(self, ctx_handle: Any, row: int) -> int:
        return int(self._lib.llama_sampler_sample(self.handle, ctx_handle, row))

    def close(self) -> None:
        if getattr(self, "handle", None):
            self._lib.llama_sampler_free(self.handle)
            self.handle = None
