"""What the engine's patches make safe on a device, tested on any backend.

- An on-device state checkpoint that cannot be made (the allocation fails, or
  it is over ``LLAMA_STATE_SEQ_DEVICE_MAX_MIB``) fails the save instead of
  aborting the process, and the rollback carries on with a host buffer
  (packaging/patches/0005). A CPU buffer never fails to allocate, so the
  budget is how the failure is caused here; on a GPU it is the same path.
- A recurrent rollback deeper than the last batch wrote snapshot planes for
  is refused instead of silently reading a stale plane (packaging/patches/0006).
- A sequence whose recurrent cell another ubatch moved keeps its snapshot
  planes, so its rollback reads its own (packaging/patches/0009).
"""

from __future__ import annotations

import ctypes
from dataclasses import replace
from functools import partial

import numpy as np
import pytest

from engine.errors import ContextError
from engine.generation.session import LoadOptions, Session
from engine.runtime import Batch, Context, ContextParams, Model
from engine.speculative.rollback import ON_DEVICE, PARTIAL_ONLY, TargetRollback
from tests.engine import conftest
from tests.engine.conftest import synth

PROMPT = " the river model"
run = partial(conftest.run, prompt=PROMPT, max_tokens=32)  # MTP to a depth, or plain with None


def test_a_device_checkpoint_over_its_budget_fails_the_save_and_rollback_falls_back_to_the_host(monkeypatch):
    import engine.generation.session as session_module

    monkeypatch.setattr(session_module.rollback, "choose", lambda *a, **k: "checkpoint")
    session = Session(LoadOptions(path=str(synth("qwen3next", "mixed", seed=2).path()), n_ctx=512))
    try:
        assert session.rollback_strategy == "checkpoint"
        plain = run(session, None)
        run(session, 3, max_tokens=4)  # something in the recurrent state
        monkeypatch.setenv("LLAMA_STATE_SEQ_DEVICE_MAX_MIB", "0")
        with pytest.raises(ContextError):  # the save itself fails (returned 0), the process lives on
            session.target.state_save(flags=PARTIAL_ONLY | ON_DEVICE)
        rollback = TargetRollback(session.target, "checkpoint")
        rollback.before_verify(3)
        assert rollback.flags == PARTIAL_ONLY  # fell back to a host buffer
        host = session.target.state_save(flags=PARTIAL_ONLY)
        assert len(rollback._checkpoint) == len(host)  # the whole state came to the host

        speculative = run(session, 3)  # every round's checkpoint now fails on the device
        assert speculative.stats.rounds > 0 and speculative.stats.accepted < speculative.stats.drafted
        assert speculative.tokens == plain.tokens
    finally:
        session.close()


def _logits(ctx: Context, row: int) -> np.ndarray:
    ptr = ctx.logits(row)
    return np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), shape=(ctx.n_vocab,)).copy()


def _decode(ctx: Context, batch: Batch, tokens: list[int], pos0: int, seq: int = 0) -> None:
    batch.clear()
    for i, tok in enumerate(tokens):
        batch.add(tok, pos0 + i, i == len(tokens) - 1, seq)
    ctx.decode(batch)


def test_a_recurrent_rollback_is_allowed_only_within_the_last_batch():
    model = Model(synth("qwen35", "random", seed=1).path(), load_mtp=False)
    params = ContextParams(n_ctx=256, n_batch=64, n_ubatch=64, n_rs_seq=4)
    ctx, fresh = Context(model, params), Context(model, params)
    try:
        assert ctx.n_rs_seq == 4
        prompt, verify = [11, 12, 13, 14, 15, 16], [21, 22, 23]
        batch = Batch(64)
        _decode(ctx, batch, prompt, 0)
        _decode(ctx, batch, verify, len(prompt))
        end = len(prompt) + len(verify)
        # rolling back all three tokens of the last batch would need a plane it never wrote
        assert not ctx.seq_rm(len(prompt), -1)
        # two of them: the plane for "kept one" was written; decoding on must equal a fresh run
        assert ctx.seq_rm(end - 2, -1)
        _decode(ctx, batch, [31], end - 2)
        rolled = _logits(ctx, 0)
        _decode(fresh, batch, prompt + verify[:1] + [31], 0)
        exact = float(np.abs(rolled - _logits(fresh, -1)).max())
        fresh.clear()
        _decode(fresh, batch, prompt + verify + [31], 0)  # what a rollback that did nothing would give
        unrolled = float(np.abs(rolled - _logits(fresh, -1)).max())
        assert exact < 1e-2 < unrolled, (exact, unrolled)
        # right after a one-token decode there is nothing to roll back into
        assert not ctx.seq_rm(end - 2, -1)
    finally:
        ctx.close()
        fresh.close()
        model.close()


def test_a_recurrent_rollback_reads_its_own_snapshot_after_other_sequences_moved_its_cell():
    """Four sequences in one context, one cell each. One decode: sequence 1's three verify rows, then a row
    of each of sequences 3, 0 and 2. llama.cpp puts sequence 1's rows in a ubatch of their own (it keeps a
    sequence's last n_rs_seq + 1 tokens together) and the other three in the next, gathering them into
    contiguous cells: sequence 1's cell is moved out of their way. Its rollback by one row must then decode
    on like a fresh context: before patch 0009 only its current state moved with it, and the rollback read
    a plane the next ubatch had written (max |Δlogit| 9.7)."""
    exact = rollback_after_a_cell_move()
    assert exact < 1e-2, exact


def rollback_after_a_cell_move(n_gpu_layers: int = 0) -> float:
    """The largest logit difference between sequence 1 rolled back after its cell moved and a fresh context
    decoding the same tokens (the GPU tier runs it with every layer on the device)."""
    model = Model(synth("qwen35", "random", seed=1).path(), load_mtp=False, n_gpu_layers=n_gpu_layers)
    params = ContextParams(n_ctx=1024, n_batch=64, n_ubatch=64, n_seq_max=4, kv_unified=True, n_rs_seq=4)
    ctx, fresh = Context(model, params), Context(model, replace(params, n_ctx=256, n_seq_max=1, kv_unified=False))
    try:
        batch = Batch(64)
        prompts = [[11 + s, 12, 13 + s, 14, 15] for s in range(4)]
        for s, prompt in enumerate(prompts):  # sequence s in cell s
            _decode(ctx, batch, prompt, 0, seq=s)
        verify = [21, 22, 23]
        batch.clear()
        for i, tok in enumerate(verify):
            batch.add(tok, len(prompts[1]) + i, True, 1)
        for s in (3, 0, 2):
            batch.add(40 + s, len(prompts[s]), True, s)
        ctx.decode(batch)
        end = len(prompts[1]) + len(verify)
        assert ctx.seq_rm(end - 1, -1, 1)  # keep two of the three
        _decode(ctx, batch, [31], end - 1, seq=1)
        rolled = _logits(ctx, 0)
        _decode(fresh, batch, prompts[1] + verify[:2] + [31], 0)
        return float(np.abs(rolled - _logits(fresh, -1)).max())
    finally:
        ctx.close()
        fresh.close()
        model.close()


def test_a_batch_with_more_outputs_than_the_context_reserves_is_refused_not_aborted():
    # llama.cpp GGML_ASSERTs on it (the process aborts); the target reserves MAX_DRAFT + 1 output rows
    model = Model(synth("glm4moe", "random", seed=1).path(), load_mtp=False)
    ctx = Context(model, ContextParams(n_ctx=256, n_batch=64, n_ubatch=64, n_outputs_max=4))
    try:
        batch = Batch(64)
        with pytest.raises(ContextError, match="5 output rows"):
            _decode_all(ctx, batch, [11, 12, 13, 14, 15])
        _decode_all(ctx, batch, [11, 12, 13, 14])  # and the context still works
    finally:
        ctx.close()
        model.close()


def _decode_all(ctx: Context, batch: Batch, tokens: list[int]) -> None:
    batch.clear()
    for i, tok in enumerate(tokens):
        batch.add(tok, i, True)
    ctx.clear()
    ctx.decode(batch)
