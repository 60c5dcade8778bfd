"""Synthetic MTP models for engine tests, generated once per spec (cached)."""

from __future__ import annotations

import pytest

from engine.synth import HeadMap, SynthModel, SynthSpec

ARCHS = ("glm4moe", "step35", "qwen35", "qwen3next")


def heads_for(arch: str) -> int:
    return 3 if arch == "step35" else 1


def synth(arch: str, weights: str = "oracle", agree: float = 1.0, reads: str = "token", seed: int = 0) -> SynthModel:
    return SynthModel(SynthSpec(arch=arch, n_heads=heads_for(arch), weights=weights,
                                heads=(HeadMap(reads, agree),), seed=seed))


@pytest.fixture(scope="session")
def synth_models() -> object:
    return synth
