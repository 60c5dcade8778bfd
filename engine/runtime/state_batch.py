"""MTP-context rows that carry their token-side embedding and their hidden state apart.

The head's input at position p is (embedding of x_p, h_target(p-1)). A text
row gives the first as a token id and the second as the row's embedding (a
legacy ``llama_batch`` with both ``token`` and ``embd``). An image row has no
token id: its first input is the projector's embedding row. llama.cpp took an
embedding row for both inputs; patch 0007 (packaging/patches/) lets a
``llama_batch_ext`` row carry a hidden state beside its embedding
(``llama_batch_ext_set_embd_state``), which this batch fills: each row with
its embedding, its state and its (M-RoPE) positions. An engine built without
the patch refuses the state (the upstream stub returns false):
:func:`takes_states` says which engine this is.
"""

from __future__ import annotations

import ctypes

import numpy as np

from engine.errors import ContextError
from engine.runtime import native
from engine.runtime.context import Context


def _row(lib: object, data: np.ndarray) -> object:
    """One ``llama_embd`` over a float32 row (llama.cpp copies it into the batch)."""
    return lib.llama_embd(data.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), 1, data.shape[0])  # type: ignore[attr-defined]


def positions_per_row(ctx: Context) -> int:
    """How many positions an embedding row of ``ctx`` takes: four on an M-RoPE model (llama.cpp's
    ``n_pos_per_embd``: temporal, row, column, unused), else one."""
    lib = native.llama()
    rope = int(lib.llama_model_rope_type(ctx.model.handle))
    return 4 if rope in (lib.LLAMA_ROPE_TYPE_MROPE, lib.LLAMA_ROPE_TYPE_IMROPE) else 1


def takes_states(ctx: Context) -> bool:
    """Whether this engine lets an MTP context's batch row carry a hidden state (patch 0007)."""
    lib = native.llama()
    handle = lib.llama_batch_ext_init(ctx.handle)
    try:
        zero = np.zeros(ctx.model.n_embd_out, dtype=np.float32)
        idx = lib.llama_batch_ext_add(handle, 0)
        return idx >= 0 and bool(lib.llama_batch_ext_set_embd_state(handle, idx, _row(lib, zero)))
    finally:
        lib.llama_batch_ext_free(handle)


def decode_rows(ctx: Context, embd: np.ndarray, states: np.ndarray, positions: np.ndarray, seq: int = 0) -> None:
    """Decode rows ``embd`` (n, n_embd: the token side) with hidden states ``states`` (n, n_embd) at
    ``positions`` (n_pos, n, section-major as mtmd lays them out) into ``ctx``, no outputs, in pieces
    of the context's batch size.

    Raises:
        ContextError: llama.cpp refused a row (an engine without patch 0007, a width that is not the
            context's) or the decode failed.
    """
    lib = native.llama()
    n = embd.shape[0]
    if states.shape != embd.shape or positions.shape != (positions_per_row(ctx), n):
        raise ContextError(f"{n} rows with {states.shape[0]} hidden states at positions {positions.shape}; the "
                           f"context takes {positions_per_row(ctx)} positions a row")
    embd = np.ascontiguousarray(embd, dtype=np.float32)
    states = np.ascontiguousarray(states, dtype=np.float32)
    pos = np.ascontiguousarray(positions.T, dtype=np.int32)  # row i's positions, contiguous
    # one llama_embd each for the token side and the state, pointed at row i in turn (numpy's per-row
    # ctypes views would cost more than the decode of a small image)
    float_p, int_p = ctypes.POINTER(ctypes.c_float), ctypes.POINTER(ctypes.c_int32)
    width, row_bytes, pos_bytes = embd.shape[1], 4 * embd.shape[1], 4 * pos.shape[1]
    embd_at, state_at, pos_at = embd.ctypes.data, states.ctypes.data, pos.ctypes.data
    token_row, state_row = lib.llama_embd(None, 1, width), lib.llama_embd(None, 1, width)
    add, set_token = lib.llama_batch_ext_add, lib.llama_batch_ext_set_embd_token
    set_state, set_pos = lib.llama_batch_ext_set_embd_state, lib.llama_batch_ext_set_pos
    handle = lib.llama_batch_ext_init(ctx.handle)
    try:
        for start in range(0, n, ctx.n_batch):
            lib.llama_batch_ext_clear(handle)
            end = min(n, start + ctx.n_batch)
            for i in range(start, end):
                token_row.data = ctypes.cast(embd_at + i * row_bytes, float_p)
                state_row.data = ctypes.cast(state_at + i * row_bytes, float_p)
                idx = add(handle, seq)
                ok = (idx >= 0 and set_token(handle, idx, token_row) and set_state(handle, idx, state_row)
                      and set_pos(handle, idx, ctypes.cast(pos_at + i * pos_bytes, int_p)))
                if not ok:
                    detail = "; ".join(native.recent_log(2)) or "this engine lacks patch 0007"
                    raise ContextError(f"llama.cpp refused image row {i} with its hidden state: {detail}")
            ctx.edits += 1
            rc = lib.llama_process(ctx.handle, lib.LLAMA_PROCESS_TYPE_DECODE, handle)
            if rc != 0:
                detail = "; ".join(native.recent_log(2)) or ""
                raise ContextError(f"llama_process failed with code {rc} ({end - start} rows). {detail}".strip())
            lib.llama_synchronize(ctx.handle)
            ctx.graphs += -(-(end - start) // ctx.n_ubatch)
    finally:
        lib.llama_batch_ext_free(handle)
