"""MTP on a real device (Vulkan, CUDA): every layer offloaded, tiny synthetic models.

What only a device shows (a CPU run passes all of these by construction):
offloading itself, greedy identity of MTP with plain decoding on the device
(hybrid rollback through snapshots, chained heads, a sidecar head), the device
against the CPU within the measured cross-backend noise, on-device state
checkpoints and their host fallback, and phase timings that include the
device's work (``llama_decode`` only submits it; engine/runtime/context.py).
"""

from __future__ import annotations

import re
from dataclasses import replace
from functools import partial

import numpy as np
import pytest

from engine.generation import identity
from engine.generation.generator import GenerateRequest, generate
from engine.generation.parallel import generate_together
from engine.generation.session import LoadOptions, Session
from engine.runtime import Batch, native
from engine.speculative.rollback import ON_DEVICE, PARTIAL_ONLY, TargetRollback
from engine.speculative.settings import SPECULATION_OFF, mtp, ngram
from tests.engine import conftest, test_device_fallbacks, test_draft_vocab, test_parallel, test_state_cache
from tests.engine.conftest import synth
from tests.gpu.conftest import ALL_LAYERS, is_software

PROMPT = " the river model"
TOKENS = 24
run = partial(conftest.run, prompt=PROMPT, max_tokens=TOKENS)  # MTP to a depth, or plain with None
device_session = partial(conftest.open_session, n_ctx=256, n_gpu_layers=ALL_LAYERS)  # every layer offloaded


def offloaded_layers() -> tuple[int, int] | None:
    for line in reversed(native.recent_log(200, "offloaded")):
        m = re.search(r"offloaded (\d+)/(\d+) layers", line)
        if m:
            return int(m.group(1)), int(m.group(2))
    return None


def test_every_layer_of_a_model_is_on_the_device(gpu_device):
    from engine.runtime import Model

    assert gpu_device["total_mib"] > 0
    model = Model(synth("qwen35", "mixed", seed=1).path(), n_gpu_layers=ALL_LAYERS, load_mtp=True)
    try:  # read the load's own log lines before contexts push them out of the kept tail
        done, total = offloaded_layers() or (0, -1)
        assert done == total > 0, native.recent_log(20)
        name = gpu_device["name"]
        assert any(name in line and "model buffer size" in line for line in native.recent_log(60)), \
            f"no model buffer on {name}: {native.recent_log(30)}"
    finally:
        model.close()


# one of each kind the engine rolls back or drafts differently
CASES = [
    pytest.param("qwen35", "combined", "mixed", 1, id="hybrid-rs-rollback"),
    pytest.param("step35", "combined", "mixed", 0, id="chained-heads"),
    pytest.param("qwen3next", "sidecar", "mixed", 2, id="sidecar-hybrid"),
]


@pytest.mark.parametrize("arch, layout, weights, seed", CASES)
def test_mtp_is_plain_greedy_decoding_on_the_device(arch, layout, weights, seed):
    session = device_session(synth(arch, weights, seed=seed), layout)
    try:
        assert session.mtp_drafter is not None
        plain = run(session, None, record_margins=True)
        noise = identity.measure_noise(session)
        for n_max in (1, 3):
            spec = run(session, n_max, record_drafts=True)
            verdict = identity.classify(plain.tokens, plain.margins, spec.tokens, noise)
            assert verdict.acceptable, f"n_max {n_max}: {verdict.describe()}"
            assert spec.stats.rounds > 0 and 0 < spec.stats.accepted < spec.stats.drafted  # rollbacks ran
    finally:
        session.close()


def _row_logits(session: Session, tokens: list[int]) -> list[np.ndarray]:
    """The target's logits at every row of one batch of ``tokens`` (the context is left empty)."""
    session.prepare(mtp=False)
    target, n_vocab = session.target, session.model.n_vocab
    batch = Batch(len(tokens))
    target.clear()
    for k, tok in enumerate(tokens):
        batch.add(tok, k, True)
    target.decode(batch)
    rows = [np.ctypeslib.as_array(target.logits(k), shape=(n_vocab,)).copy() for k in range(len(tokens))]
    target.clear()
    return rows


def test_the_device_decodes_like_the_cpu_within_the_cross_backend_noise():
    model = synth("qwen35", "random", seed=3)
    device, cpu = device_session(model), conftest.open_session(model, n_ctx=256)
    try:
        probe = [(7 + 37 * i) % device.model.n_vocab for i in range(8)]  # within the target's n_outputs_max
        cross = max(float(np.abs(a - b).max()) for a, b in zip(_row_logits(device, probe), _row_logits(cpu, probe),
                                                               strict=True))
        assert cross < 0.05, f"device and CPU logits differ by {cross} (f32 tiny model)"
        on_cpu = run(cpu, None, record_margins=True)
        on_device = run(device, 3)
        verdict = identity.classify(on_cpu.tokens, on_cpu.margins, on_device.tokens,
                                    max(cross, identity.measure_noise(cpu)))
        assert verdict.acceptable, verdict.describe()
    finally:
        device.close()
        cpu.close()


def test_checkpoints_stay_on_the_device_and_fall_back_to_the_host_over_budget(monkeypatch):
    import engine.generation.session as session_module

    monkeypatch.setattr(session_module.rollback, "choose", lambda *a, **k: "checkpoint")
    session = device_session(synth("qwen3next", "mixed", seed=2))
    try:
        assert session.rollback_strategy == "checkpoint"
        plain = run(session, None)
        on_device = run(session, 3)
        assert on_device.tokens == plain.tokens and on_device.stats.phase_seconds["rollback"] > 0
        rollback = TargetRollback(session.target, "checkpoint")
        rollback.before_verify(3)
        assert rollback.flags == PARTIAL_ONLY | ON_DEVICE
        assert len(rollback._checkpoint) < len(session.target.state_save(flags=PARTIAL_ONLY))  # metadata only

        monkeypatch.setenv("LLAMA_STATE_SEQ_DEVICE_MAX_MIB", "0")  # packaging/patches/0005
        rollback = TargetRollback(session.target, "checkpoint")
        rollback.before_verify(3)
        assert rollback.flags == PARTIAL_ONLY
        assert run(session, 3).tokens == plain.tokens
    finally:
        session.close()


def test_phase_timings_include_the_device_work():
    # Before Context.decode synchronised, the verify phase read 1.2 ms on lavapipe and
    # the wait for the device landed in "sampling" (the first logits read): 329 ms.
    session = device_session(synth("qwen35", "mixed", seed=1))
    try:
        run(session, 3)  # the first decode of each shape compiles pipelines: keep it out of the figures
        result = run(session, 3)
        phases, elapsed = result.stats.phase_seconds, result.stats.elapsed()
        device = sum(phases[k] for k in ("prefill", "draft", "verify", "catch_up", "rollback"))
        host = phases["sampling"] + phases["other"]
        assert device >= 0.75 * elapsed, (phases, elapsed)
        assert host <= 0.25 * elapsed, (phases, elapsed)
        rounds = result.stats.rounds + result.stats.plain_steps
        assert phases["verify"] / rounds > phases["sampling"] / rounds, phases
    finally:
        session.close()


@pytest.mark.parametrize("arch", ["glm4moe", "qwen35", "deepseek2"])
def test_a_cut_draft_vocabulary_on_the_device(arch, monkeypatch):
    """Patch 0008 multiplies only the first n rows of the head's LM head: on the device, every output row of
    the cut head is the whole head's first n (-inf past them), drafts stay below n, and output is plain
    decoding's (tests/engine/test_draft_vocab.py on the CPU)."""
    path = str(test_draft_vocab.model_152k(arch).path("combined"))
    n_draft, prompt = test_draft_vocab.N_DRAFT, test_draft_vocab.PROMPT
    with Session(LoadOptions(path=path, n_ctx=512, n_gpu_layers=ALL_LAYERS)) as session:
        plain = generate(session, GenerateRequest(prompt=prompt, max_tokens=32, speculative=SPECULATION_OFF,
                                                  record_margins=True))
        noise = identity.measure_noise(session)
    with Session(LoadOptions(path=path, n_ctx=512, n_gpu_layers=ALL_LAYERS, draft_vocab=n_draft)) as session:
        assert session.mtp_drafter.ctx.draft_vocab == n_draft
        shadow = test_draft_vocab.Shadow(session.mtp_drafter.ctx, monkeypatch)
        try:
            drafted = generate(session, GenerateRequest(prompt=prompt, max_tokens=32, speculative=mtp(3),
                                                        record_drafts=True))
        finally:
            shadow.close()
    verdict = identity.classify(plain.tokens, plain.margins, drafted.tokens, noise)
    assert verdict.acceptable, verdict.describe()
    assert shadow.rows >= drafted.stats.drafted > 0 and shadow.past > 0
    assert all(t < n_draft for d in drafted.drafts_per_round for t in d)


@pytest.mark.parametrize("arch", ["glm4moe", "qwen35"])
def test_several_sequences_in_one_batch_on_the_device(arch):
    """Three sequences, two joining while the first runs, each with MTP: each one's output and drafts are what
    it gives alone on the device (tests/engine/test_parallel.py on the CPU; qwen35 rolls back per-sequence
    recurrent state)."""
    path = str(synth(arch, "mixed", agree=0.7, reads="hidden").path())
    reqs = test_parallel.requests(mtp(3), n=3)
    with Session(LoadOptions(path=path, n_ctx=512 * 3, n_gpu_layers=ALL_LAYERS)) as session:
        solo = [generate(session, replace(r, record_margins=True)) for r in reqs]
        noise = identity.measure_noise(session)
    with Session(LoadOptions(path=path, n_ctx=512, parallel=3, n_gpu_layers=ALL_LAYERS)) as session:
        together = generate_together(session, reqs, starts=[0, 2, 4])
    for s, t in zip(solo, together, strict=True):
        test_parallel.same_as_alone(s, t, noise)
    assert sum(t.stats.rounds for t in together) > 0


def test_a_recurrent_cell_moved_on_the_device_keeps_its_rollback_snapshots():
    """packaging/patches/0009 moves a moved cell's snapshot planes with get_rows and set_rows in the device
    graph: sequence 1's rollback, after the next ubatch of the same decode moved its cell, decodes on like a
    fresh context on the device too (tests/engine/test_device_fallbacks.py on the CPU)."""
    exact = test_device_fallbacks.rollback_after_a_cell_move(n_gpu_layers=ALL_LAYERS)
    assert exact < 1e-2, exact


@pytest.mark.parametrize("arch", ["qwen35", "qwen3next"])
def test_hybrid_sequences_joining_and_ending_while_others_draft_on_the_device(arch, gpu_device):
    """Eight requests on four sequences of a hybrid, fixed-depth MTP, the schedule that moved recurrent cells
    under other sequences' rollbacks before patch 0009: each reply is what it is alone on the device.

    For a real GPU (scripts/device_check.sh). Mesa's lavapipe corrupts its heap on this run in most tries
    ("corrupted double-linked list", SIGSEGV in its queue thread), with the engine before patch 0009 as after
    it, and qwen3next crashes it even on one sequence with llama.cpp's own libllama (docs/gpu.md), so a
    software device proves nothing here either way."""
    if is_software(gpu_device):
        pytest.skip(f"{gpu_device['description']} is a software device whose heap this run corrupts (docs/gpu.md)")
    test_parallel.hybrids_joining_and_ending(arch, n_gpu_layers=ALL_LAYERS)


@pytest.mark.parametrize("arch, spec", [("glm4moe", mtp(3)), ("qwen35", mtp(3)),
                                        ("glm4moe", ngram(3, mtp_too=True))], ids=["glm4moe", "qwen35", "mtp-ngram"])
def test_a_conversation_comes_back_from_host_memory_onto_the_device(arch, spec):
    """A conversation, another that cuts it, the first continued, every layer on the device: its state went
    to host memory and back (engine/generation/state_cache.py), the MTP lane's rows with it (MTP alone, or
    the MTP half of MTP + n-gram), and the reply and drafts are what prefilling it again gives
    (tests/engine/test_state_cache.py on the CPU)."""
    path = str(synth(arch, "random", seed=5).path())
    with Session(LoadOptions(path=path, n_ctx=512, state_cache_mib=0, n_gpu_layers=ALL_LAYERS)) as session:
        _, baseline = test_state_cache.switch_and_back(session, spec)
    with Session(LoadOptions(path=path, n_ctx=512, n_gpu_layers=ALL_LAYERS)) as session:
        first, back = test_state_cache.switch_and_back(session, spec)
        assert session.states.restored == 1
        assert back.stats.prompt_reused >= first.stats.prompt_tokens - 1
        test_state_cache.same(session, back, baseline)


def test_auto_replies_at_once_counts_the_devices_own_memory(gpu_device):
    """With every layer offloaded, "Replies at once: Auto" weighs the device's free memory (as ggml reports it)
    for the offloaded share, and RAM for the rest; the session loads what it chose."""
    from engine.generation.load_plan import LoadPlan

    path = str(synth("glm4moe", "mixed", agree=0.7, reads="hidden").path())
    options = LoadOptions(path=path, n_ctx=512, parallel=0, n_gpu_layers=ALL_LAYERS)
    plan = LoadPlan.read(options)
    device = plan.device
    assert device is not None and device.share == 1.0 and device.free > 0
    assert plan.host_read_bytes() == 0  # every layer on the device: the state cache may take what RAM holds
    assert f"on {device.name} and" in plan.parallel_reason, plan.parallel_reason
    with Session(plan.options, plan) as session:
        assert session.n_seq == plan.options.parallel == 4  # a tiny model: four fit on any device
        assert session.describe()["parallel_reason"] == plan.parallel_reason
