"""A llama.cpp sampler chain built from a request's sampling settings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.runtime import native


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings. ``temperature <= 0`` means greedy (argmax)."""

    temperature: float = 0.0
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    seed: int = 0xFFFFFFFF  # LLAMA_DEFAULT_SEED: random

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


class Sampler:
    """Owns a ``llama_sampler`` chain; :meth:`sample` also accepts the token."""

    def __init__(self, params: SamplingParams) -> None:
        lib = native.llama()
        self._lib = lib
        self.params = params
        chain = lib.llama_sampler_chain_init(lib.llama_sampler_chain_default_params())
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

    def sample(self, ctx_handle: Any, row: int) -> int:
        return int(self._lib.llama_sampler_sample(self.handle, ctx_handle, row))

    def close(self) -> None:
        if getattr(self, "handle", None):
            self._lib.llama_sampler_free(self.handle)
            self.handle = None
