"""How many sequences a load holds when nobody chose (engine/store/parallel_fit.py): 4 where their KV cache
fits, else 2, else 1."""

from __future__ import annotations

import pytest

from engine.store.fit import estimate
from engine.store.parallel_fit import DEFAULT_PARALLEL, SHARE, default_parallel
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


def test_a_load_asking_for_auto_gets_what_fits_and_says_it_chose(model):
    from engine.generation.load_plan import LoadPlan
    from engine.load_options import LoadOptions

    plan = LoadPlan.read(LoadOptions(path=model, n_ctx=N_CTX, parallel=0))
    assert plan.parallel_auto and plan.options.parallel == default_parallel(model, n_ctx=N_CTX)[0]
    chosen = LoadPlan.read(LoadOptions(path=model, n_ctx=N_CTX, parallel=3))
    assert not chosen.parallel_auto and chosen.options.parallel == 3


def test_sequences_auto_chose_that_do_not_load_are_tried_as_one(model, monkeypatch):
    """The estimate counts RAM, not a GPU's own memory: a refused context with Auto's sequences loads one
    (caused here by a session that refuses more than one; a real GPU's refusal cannot be caused on this CPU)."""
    from engine.errors import ContextError
    from engine.generation import session as session_module
    from engine.generation.load_plan import LoadPlan
    from engine.load_options import LoadOptions
    from engine.worker.server import Worker

    real = session_module.Session
    asked: list[int] = []

    def refusing(options, plan=None):
        asked.append(options.parallel)
        if options.parallel > 1:
            raise ContextError("llama.cpp could not create a context (out of device memory)")
        return real(options, plan)

    monkeypatch.setattr(session_module, "Session", refusing)
    plan = LoadPlan.read(LoadOptions(path=model, n_ctx=512, parallel=0))
    assert plan.options.parallel > 1  # this machine fits several
    session = Worker._session(plan)
    try:
        assert asked == [plan.options.parallel, 1] and session.n_seq == 1
    finally:
        session.close()
    chosen = LoadPlan.read(LoadOptions(path=model, n_ctx=512, parallel=2))
    with pytest.raises(ContextError):  # a count the user chose is not changed behind their back
        Worker._session(chosen)
