"""How many sequences a load holds when nobody chose (engine/store/parallel_fit.py): 4 where their KV cache
fits (in RAM, and in a GPU's own memory for the layers offloaded to it), else 2, else 1."""

from __future__ import annotations

import re

import pytest

from engine.store.fit import estimate, estimates
from engine.store.parallel_fit import DEFAULT_PARALLEL, SHARE, DeviceMemory, default_parallel
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


@pytest.mark.parametrize("fits", [2, 1])
def test_with_layers_on_a_gpu_its_own_memory_limits_the_sequences(model, fits):
    """RAM to spare, but the GPU holds the KV cache of every offloaded layer: its free memory decides."""
    whole = DeviceMemory(free=1, share=1.0, name="Test GPU")
    e = estimate(model, n_ctx=N_CTX * fits, available=1)
    gpu_free = int(whole.need(e) / SHARE) + 1
    n, line = default_parallel(model, n_ctx=N_CTX, available=10**12,
                               device=DeviceMemory(free=gpu_free, share=1.0, name="Test GPU"))
    assert n == fits, line
    assert "would not fit in" in line and "of Test GPU's memory" in line and " in RAM" in line
    # the same GPU with half the layers left on the CPU holds less of each sequence: more fit
    half, _ = default_parallel(model, n_ctx=N_CTX, available=10**12,
                               device=DeviceMemory(free=gpu_free, share=0.5, name="Test GPU"))
    assert half >= n
    # and RAM alone (as before GPUs were counted) would have taken 4
    assert default_parallel(model, n_ctx=N_CTX, available=10**12)[0] == DEFAULT_PARALLEL


def test_layers_on_a_gpu_still_need_ram_for_the_rest(model):
    e = estimate(model, n_ctx=N_CTX * 4, available=1)
    device = DeviceMemory(free=10**12, share=0.5, name="Test GPU")
    host = e.total - device.need(e)
    assert 0 < host < e.total
    assert default_parallel(model, n_ctx=N_CTX, available=int(host / SHARE) + 1, device=device)[0] == 4
    assert default_parallel(model, n_ctx=N_CTX, available=int(host / SHARE) - 1, device=device)[0] < 4


def test_the_gpu_line_says_where_the_memory_goes(model):
    n, line = default_parallel(model, n_ctx=N_CTX, available=10**12,
                               device=DeviceMemory(free=10**12, share=1.0, name="Test GPU"))
    assert n == 4 and re.search(r"need ~[\d.]+ [MG]iB on Test GPU and ~[\d.]+ [MG]iB in RAM", line), line


def test_no_layers_offloaded_or_no_gpu_is_ram_only(model):
    """On this CPU engine the load plan finds no GPU to count, whatever --gpu-layers says."""
    from engine.generation.load_plan import device_memory
    from engine.gguf.facts import read_facts
    from engine.load_options import LoadOptions

    facts = read_facts(model)
    assert device_memory(LoadOptions(path=model, n_gpu_layers=0), facts) is None
    assert device_memory(LoadOptions(path=model, n_gpu_layers=-1), facts) is None  # a CPU build lists no GPU
    assert device_memory(LoadOptions(path=model, n_gpu_layers=-1, rpc=("127.0.0.1:50052",)), facts) is None


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
    assert plan.parallel_reason.startswith(f"{plan.options.parallel} request")
    chosen = LoadPlan.read(LoadOptions(path=model, n_ctx=N_CTX, parallel=3))
    assert not chosen.parallel_auto and chosen.options.parallel == 3 and chosen.parallel_reason == ""


def test_sequences_auto_chose_that_do_not_load_are_tried_as_one(model, monkeypatch):
    """Where the estimate is wrong, a refused context with Auto's sequences loads one (caused here by a
    session that refuses more than one; a real GPU's refusal cannot be caused on this CPU)."""
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
        assert session.describe()["parallel_reason"].startswith(f"1 request at once ({plan.options.parallel} did not")
    finally:
        session.close()
    chosen = LoadPlan.read(LoadOptions(path=model, n_ctx=512, parallel=2))
    with pytest.raises(ContextError):  # a count the user chose is not changed behind their back
        Worker._session(chosen)


@pytest.mark.parametrize("swa_full", [False, True], ids=["window", "full"])
def test_a_sliding_window_model_is_sized_by_the_cache_it_keeps(swa_full):
    """A sliding-window model keeping its window only needs a fraction of the cache it needs keeping every
    cell (Preferences, --swa-full): with memory for 4 sequences' windows but not 4 whole caches, Auto
    chooses 4 only where the load keeps the windows, and the load plan passes the preference on."""
    from engine.generation.load_plan import LoadPlan
    from engine.load_options import LoadOptions

    path = str(SynthModel(SynthSpec(arch="step35", weights="random")).path())  # a window of 16
    window, full = (estimates(path, [N_CTX * 4], available=1, swa_full=full, n_seqs=[4])[0] for full in (False, True))
    assert window.kv_cache < full.kv_cache
    available = int(window.total / SHARE) + 1
    n, line = default_parallel(path, n_ctx=N_CTX, available=available, swa_full=swa_full)
    assert (n < 4) is swa_full, line
    # what the line says 4 sequences need follows the preference too
    plan = LoadPlan.read(LoadOptions(path=path, n_ctx=N_CTX, parallel=0, swa_full=swa_full))
    assert plan.options.parallel == 4
    assert f"need ~{(full if swa_full else window).total / 2**20:.0f} MiB" in plan.parallel_reason


@pytest.mark.parametrize("kv_unified", [True, False], ids=["one-pool", "pool-each"])
def test_a_sliding_window_model_is_sized_by_the_pools_it_keeps(kv_unified):
    """In a pool of its own each sequence's windowed layers hold a ubatch beside its window (one pool holds one
    for all): with memory for 4 sequences' windows in one pool, Auto chooses 4 only there, and the load plan
    passes the choice of pool on."""
    from engine.generation.load_plan import LoadPlan
    from engine.load_options import LoadOptions

    path = str(SynthModel(SynthSpec(arch="step35", weights="random")).path())  # a window of 16
    one, each = (estimates(path, [N_CTX * 4], available=1, n_seqs=[4], kv_unified=u)[0] for u in (True, False))
    assert one.kv_cache < each.kv_cache
    available = int(one.total / SHARE) + 1
    n, line = default_parallel(path, n_ctx=N_CTX, available=available, kv_unified=kv_unified)
    assert (n < 4) is not kv_unified, line
    plan = LoadPlan.read(LoadOptions(path=path, n_ctx=N_CTX, parallel=0, kv_unified=kv_unified))
    assert f"need ~{(one if kv_unified else each).total / 2**20:.0f} MiB" in plan.parallel_reason
