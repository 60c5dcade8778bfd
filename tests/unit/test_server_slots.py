"""``serve``'s ``--parallel`` when not given (engine/server/slots.py): 4 where their KV cache fits, else 2, else 1."""

from __future__ import annotations

import pytest

from engine.server.slots import DEFAULT_PARALLEL, SHARE, default_parallel
from engine.store.fit import estimate
from engine.synth import SynthModel, SynthSpec

N_CTX = 4096


@pytest.fixture(scope="module")
def model() -> str:
    return str(SynthModel(SynthSpec(arch="glm4moe", weights="random")).path())


def need(path: str, n: int) -> int:
    """What ``n`` sequences of N_CTX tokens are estimated to take."""
    return estimate(path, n_ctx=N_CTX * n, available=1).total


@pytest.mark.parametrize("fits", [4, 2, 1])
def test_the_most_sequences_whose_kv_cache_fits(model, fits):
    assert need(model, 1) < need(model, 2) < need(model, 4)  # each sequence holds its own cells
    # memory where exactly ``fits`` sequences fit within the share the default may take
    available = int(need(model, fits) / SHARE) + 1 if fits < 4 else 10**12
    n, line = default_parallel(model, n_ctx=N_CTX, available=available)
    assert n == fits, line
    assert line.startswith(f"{fits} request") and "--parallel N" in line
    if fits < 4:
        assert "would not fit" in line


def test_one_sequence_even_where_nothing_fits(model):
    n, line = default_parallel(model, n_ctx=N_CTX, available=1)
    assert n == 1, line


def test_a_file_it_cannot_read_gives_llama_servers_default(tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"not a gguf")
    n, line = default_parallel(bad, n_ctx=N_CTX, available=10**12)
    assert n == DEFAULT_PARALLEL and "not estimated" in line
