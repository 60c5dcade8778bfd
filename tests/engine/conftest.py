"""Synthetic MTP models for engine tests, generated once per spec (cached)."""

from __future__ import annotations

from typing import Any

import pytest

from engine.generation.generator import GenerateRequest, GenerateResult, generate
from engine.generation.session import LoadOptions, Session
from engine.speculative.depth import DepthPolicy
from engine.speculative.settings import SPECULATION_OFF, SpeculativeSettings, mtp
from engine.synth import HeadMap, SynthModel, SynthSpec
from engine.synth.spec import ARCHITECTURES, DERIVED_ARCHITECTURES, default_heads

# Hand-written layouts: these also have oracle weights (exact acceptance).
ARCHS = ARCHITECTURES
# Every architecture engine.gguf.sidecar.MTP_ARCHITECTURES claims; the derived ones
# (tensor lists asked of llama.cpp's loader) have random and mixed weights only.
ALL_MTP_ARCHS = ARCHITECTURES + DERIVED_ARCHITECTURES


def heads_for(arch: str) -> int:
    """MTP heads of the test models: step35 3, mimo2 and hy_v3 2 (chained), others 1."""
    return default_heads(arch)


def synth(arch: str, weights: str = "oracle", agree: float = 1.0, reads: str = "token", seed: int = 0,
          n_heads: int | None = None, run: int = 0) -> SynthModel:
    return SynthModel(SynthSpec(arch=arch, n_heads=heads_for(arch) if n_heads is None else n_heads,
                                weights=weights, heads=(HeadMap(reads, agree, run),), seed=seed))


@pytest.fixture(scope="session")
def synth_models() -> object:
    return synth


def open_session(model: SynthModel, layout: str = "combined", n_ctx: int = 512, **options: Any) -> Session:
    """A session on one of ``model``'s files: ``combined`` (the MTP head inside), ``trunk`` (no head),
    ``sidecar`` (the trunk with its head in a file beside it); ``options``: further LoadOptions fields."""
    if layout == "sidecar":
        return Session(LoadOptions(path=str(model.path("trunk")), sidecar=str(model.path("sidecar")), n_ctx=n_ctx,
                                   **options))
    return Session(LoadOptions(path=str(model.path(layout)), n_ctx=n_ctx, **options))


def run(session: Session, speculative: SpeculativeSettings | int | None = None, *, prompt: str, max_tokens: int,
        n_min: int = 0, p_min: float = 0.0, policy: DepthPolicy | None = None, **request: Any) -> GenerateResult:
    """One reply to ``prompt``: with ``speculative``, MTP to that depth when it is a number (with ``n_min``
    and ``p_min``), plain decoding when None; ``request``: further GenerateRequest fields; ``policy``:
    the depth policy to use instead of the session's. Test files bind their prompt and length with
    ``functools.partial``."""
    if not isinstance(speculative, SpeculativeSettings):
        speculative = mtp(speculative, p_min=p_min, n_min=n_min) if speculative else SPECULATION_OFF
    return generate(session, GenerateRequest(prompt=prompt, max_tokens=max_tokens, speculative=speculative,
                                             **request), policy=policy)
