"""Synthetic MTP models for engine tests, generated once per spec (cached)."""

from __future__ import annotations

import pytest

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
