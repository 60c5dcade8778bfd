"""A llama.cpp context, a reusable token batch, and memory/state operations."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

from engine.errors import ContextError
from engine.runtime import native
from engine.runtime.model import Model


@dataclass(frozen=True)
class ContextParams:
    n_ctx: int = 2048
    n_batch: int = 512
    n_ubatch: int = 512
    n_threads: int = 1
    n_seq_max: int = 1  # sequences the context holds; each gets n_ctx / n_seq_max cells
    # one pool of cells for every sequence: a batch of several sequences' rows is then one ubatch
    # (llama.cpp splits a batch per sequence otherwise); the engine keeps each within n_ctx / n_seq_max
    kv_unified: bool = False
    n_rs_seq: int = 0  # recurrent snapshots kept for partial rollback (hybrid targets)
    n_outputs_max: int = 0  # 0: llama.cpp's default
    mtp: bool = False  # an MTP (draft head) context rather than a target context
    # a sliding-window model keeps every cell of its windowed layers (llama.cpp's default, as llama-server's
    # --swa-full): any prefix can then be cut back to, at the cost of a full-size cache for those layers too
    swa_full: bool = True


def seq_id_rows(capacity: int) -> tuple[Any, Any, Any]:
    """A batch's sequence ids, one per row: the ids (row i's at index i), the array of row pointers
    ``llama_batch.seq_id`` reads (row i's points at id i; keep it alive with the batch), and that array as
    ``int32_t **``. The pointers are written as addresses in one go: a ``ctypes.cast`` per row cost ~1 ms
    for a 512-row batch, and every generation makes one."""
    seq = (ctypes.c_int32 * capacity)()
    base = ctypes.addressof(seq)
    rows = (ctypes.c_void_p * capacity)(*range(base, base + 4 * capacity, 4))
    return seq, rows, ctypes.cast(rows, ctypes.POINTER(ctypes.POINTER(ctypes.c_int32)))


class Batch:
    """A ``llama_batch`` whose arrays are owned by Python (no llama_batch_free).

    Each row belongs to one sequence (``seq``, 0 unless given): a multi-sequence
    context decodes several replies' rows in one batch. Rows may carry a
    hidden-state row (``embd``) next to the token: that is how the MTP head
    receives h_target(p-1).
    """

    def __init__(self, capacity: int, n_embd: int = 0) -> None:
        lib = native.llama()
        self.capacity = capacity
        self.n_embd = n_embd
        self.tokens = (ctypes.c_int32 * capacity)()
        self.pos = (ctypes.c_int32 * capacity)()
        self.n_seq_id = (ctypes.c_int32 * capacity)(*([1] * capacity))
        self._seq, self._seq_rows, self.seq_id = seq_id_rows(capacity)
        self.logits = (ctypes.c_int8 * capacity)()
        self.embd = (ctypes.c_float * (capacity * n_embd))() if n_embd else None
        self.n_outputs = 0
        self.raw = lib.llama_batch()
        self.raw.token = self.tokens
        self.raw.pos = self.pos
        self.raw.n_seq_id = self.n_seq_id
        self.raw.seq_id = self.seq_id
        self.raw.logits = self.logits
        self.raw.embd = (
            ctypes.cast(self.embd, ctypes.POINTER(ctypes.c_float)) if self.embd is not None else None
        )
        self.n = 0

    def clear(self) -> None:
        self.n = 0
        self.n_outputs = 0

    def add(self, token: int, pos: int, output: bool, seq: int = 0) -> int:
        i = self.n
        if i >= self.capacity:
            raise ContextError(f"batch overflow: capacity {self.capacity}")
        self.tokens[i] = token
        self.pos[i] = pos
        self._seq[i] = seq
        self.logits[i] = 1 if output else 0
        self.n_outputs += 1 if output else 0
        self.n = i + 1
        return i

    def extend(self, other: Batch) -> int:
        """Append ``other``'s rows (tokens, positions, sequences, outputs, hidden-state rows); the row where
        they begin. Several sequences' drafters decode their rows together this way."""
        start, n = self.n, other.n
        if start + n > self.capacity:
            raise ContextError(f"batch overflow: capacity {self.capacity}")
        if other.n_embd != self.n_embd:
            raise ContextError("the batches carry hidden-state rows of different widths")
        for mine, theirs, width in ((self.tokens, other.tokens, 4), (self.pos, other.pos, 4),
                                    (self._seq, other._seq, 4), (self.logits, other.logits, 1)):
            ctypes.memmove(ctypes.addressof(mine) + start * width, ctypes.addressof(theirs), n * width)
        if self.n_embd:
            ctypes.memmove(self.embd_row_address(start), other.embd_row_address(0), n * 4 * self.n_embd)
        self.n += n
        self.n_outputs += other.n_outputs
        return start

    def embd_row_address(self, i: int) -> int:
        return ctypes.addressof(self.embd) + i * 4 * self.n_embd  # type: ignore[arg-type]


# llama-ext.h declares C++ functions: the symbol is mangled, differently per ABI (llama_cpp_ext binds
# its own the same way)
_SET_MTP_N_VOCAB = ("llama_set_mtp_n_vocab", "_Z21llama_set_mtp_n_vocabP13llama_contexti",
                    "?llama_set_mtp_n_vocab@@YAXPEAUllama_context@@H@Z")


def _ext_function(names: tuple[str, ...], argtypes: list[Any], restype: Any) -> Any:
    """The first of ``names`` the engine's libllama exports, typed; None when it has none."""
    lib = native.llama().llama_cpp._lib
    for name in names:
        fn = getattr(lib, name, None)
        if fn is not None:
            fn.argtypes, fn.restype = argtypes, restype
            return fn
    return None


class Context:
    """A ``llama_context*`` over a :class:`Model`."""

    def __init__(self, model: Model, params: ContextParams) -> None:
        lib = native.llama()
        self._lib = lib
        self.model = model
        self.params = params
        cp = lib.llama_context_default_params()
        cp.n_ctx = params.n_ctx
        cp.n_batch = params.n_batch
        cp.n_ubatch = params.n_ubatch
        cp.n_seq_max = params.n_seq_max
        cp.kv_unified = params.kv_unified
        cp.n_threads = params.n_threads
        cp.n_threads_batch = params.n_threads
        cp.n_rs_seq = params.n_rs_seq
        cp.swa_full = params.swa_full
        cp.no_perf = True
        if params.n_outputs_max:
            cp.n_outputs_max = params.n_outputs_max
        if params.mtp:
            cp.ctx_type = lib.LLAMA_CONTEXT_TYPE_MTP
        handle = lib.llama_init_from_model(model.handle, cp)
        if not handle:
            detail = "; ".join(native.recent_log(3)) or "no message from llama.cpp"
            raise ContextError(f"llama.cpp could not create a context (n_ctx={params.n_ctx}): {detail}")
        self.handle = handle
        self.memory = lib.llama_get_memory(handle)
        self.n_seq = int(lib.llama_n_seq_max(handle))
        # what one sequence may hold: llama.cpp's share per sequence (padded to 256), or in a
        # unified pool the engine's own share of it
        self.n_ctx = (int(lib.llama_n_ctx(handle)) // self.n_seq if params.kv_unified
                      else int(lib.llama_n_ctx_seq(handle)))
        self.n_batch = int(lib.llama_n_batch(handle))
        self.n_rs_seq = int(lib.llama_n_rs_seq(handle))
        self.n_vocab = model.n_vocab
        self.draft_vocab = self.n_vocab  # token ids an MTP context's head drafts among (set_draft_vocab)
        self.threads = params.n_threads
        self.n_ubatch = int(lib.llama_n_ubatch(handle))
        self.graphs = 0  # compute graphs run (one per ubatch), against graphs_reused()
        self.exports_hidden = False  # every row's hidden state for an MTP head (set_embeddings_nextn)
        # bumped by everything that changes the memory: a record of what the context holds
        # (engine/generation/prefix_cache.py) is only trusted while this is unchanged
        self.edits = 0

    def decode(self, batch: Batch) -> None:
        """Decode ``batch`` and wait until the device has finished it.

        ``llama_decode`` only submits the work on a GPU backend (Vulkan, CUDA,
        Metal): it returns after graph build and launch, and the wait lands
        on the next call or the first logits read. Every clock the policy,
        autotune and the statistics read sits around a decode, so without the
        wait here a verify of k rows would look as cheap as its launch and the
        adaptive policy would draft too deep (measured on lavapipe: verify
        1.2 ms against "host" 329 ms). The loop reads the logits or the hidden
        state right after every decode anyway, so nothing is lost by waiting;
        on the CPU backend the call returns at once.
        """
        if self.params.n_outputs_max and batch.n_outputs > self.params.n_outputs_max:
            # llama.cpp asserts on this (GGML_ASSERT, the process aborts): refuse it here instead
            raise ContextError(f"a batch with {batch.n_outputs} output rows; this context reserves "
                               f"{self.params.n_outputs_max}")
        batch.raw.n_tokens = batch.n
        self.edits += 1
        rc = self._lib.llama_decode(self.handle, batch.raw)
        if rc != 0:
            detail = "; ".join(native.recent_log(2)) or ""
            raise ContextError(f"llama_decode failed with code {rc} ({batch.n} tokens). {detail}".strip())
        self._lib.llama_synchronize(self.handle)
        self.graphs += -(-batch.n // self.n_ubatch)

    def graphs_reused(self) -> int:
        """How many of this context's compute graphs llama.cpp reused instead of building.

        llama.cpp keeps only the last graph: a decode whose shape differs from
        the previous one's (another verify size, a catch-up row then a draft
        row) builds its graph again, and on CUDA leaves CUDA graphs unused.
        ``graphs - graphs_reused()`` is the number of builds (engine/bench/graph_reuse.py).
        """
        return int(self._lib.llama_perf_context(self.handle).n_reused)

    def set_threads(self, n_threads: int) -> None:
        """Decode with ``n_threads`` from now on (autotune times thread counts without reloading)."""
        self._lib.llama_set_n_threads(self.handle, n_threads, n_threads)
        self.threads = n_threads

    def logits(self, i: int) -> Any:
        """Pointer to the logits of batch row ``i`` (valid until the next decode)."""
        return self._lib.llama_get_logits_ith(self.handle, i)

    # -- memory -----------------------------------------------------------
    def seq_rm(self, p0: int, p1: int = -1, seq: int = 0) -> bool:
        self.edits += 1
        return bool(self._lib.llama_memory_seq_rm(self.memory, seq, p0, p1))

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        """Sequence ``dst`` also holds ``src``'s cells at positions [p0, p1) (-1: open). In a unified pool
        (``kv_unified``) the cells are shared, not copied: the cost is bookkeeping, whatever their number."""
        self.edits += 1
        self._lib.llama_memory_seq_cp(self.memory, src, dst, p0, p1)

    def seq_pos_max(self, seq: int = 0) -> int:
        """The last position sequence ``seq`` holds (-1: none)."""
        return int(self._lib.llama_memory_seq_pos_max(self.memory, seq))

    def seq_clear(self, seq: int) -> None:
        """Empty one sequence (the whole context when it holds one)."""
        if self.n_seq == 1:
            self.clear()
        elif not self.seq_rm(0, -1, seq):
            raise ContextError(f"could not clear sequence {seq}")

    def clear(self) -> None:
        self.edits += 1
        self._lib.llama_memory_clear(self.memory, True)

    # -- state checkpoints (for hybrid targets without n_rs_seq) ----------
    def state_save(self, seq: int = 0, flags: int = 1, into: Any = None) -> Any:
        """Save a sequence's state (flags=1: PARTIAL_ONLY, i.e. recurrent/SWA part).

        ``into``: a buffer from an earlier save, reused when large enough (a
        checkpoint is taken every round; allocating one each time is waste).
        With ON_DEVICE (2) the tensor data stays in llama.cpp's device
        buffers and the returned buffer holds only the metadata.
        """
        size = self._lib.llama_state_seq_get_size_ext(self.handle, seq, flags)
        if size == 0:
            raise ContextError("llama.cpp could not size a state checkpoint")
        buf = into if into is not None and len(into) >= size else (ctypes.c_uint8 * size)()
        written = self._lib.llama_state_seq_get_data_ext(self.handle, buf, size, seq, flags)
        if written != size:
            raise ContextError(f"state checkpoint wrote {written} of {size} bytes")
        return buf

    def state_size(self, seq: int = 0, flags: int = 1) -> int:
        """Bytes :meth:`state_save` would copy for sequence ``seq`` with ``flags``."""
        return int(self._lib.llama_state_seq_get_size_ext(self.handle, seq, flags))

    def seq_pos_min(self, seq: int = 0) -> int:
        """The lowest position sequence ``seq`` holds a cell for (-1: none)."""
        return int(self._lib.llama_memory_seq_pos_min(self.memory, seq))

    def keeps_window(self, n: int, seq: int = 0) -> bool:
        """Whether sequence ``seq`` cut back to its first ``n`` positions still holds the cells a sliding
        window needs to go on from ``n`` (llama-server's check before reusing a cache): a state brought
        back from host memory holds only its last window's cells (engine/generation/state_cache.py)."""
        n_swa = self.model.n_swa
        return not n_swa or self.seq_pos_min(seq) <= max(0, n - n_swa)

    def state_restore(self, buf: Any, seq: int = 0, flags: int = 1) -> None:
        self.edits += 1
        read = self._lib.llama_state_seq_set_data_ext(self.handle, buf, len(buf), seq, flags)
        if read == 0:
            raise ContextError("restoring a state checkpoint failed")

    # -- MTP hooks ----------------------------------------------------------
    def set_embeddings_nextn(self, value: bool, masked: bool) -> None:
        from llama_cpp import llama_cpp_ext

        llama_cpp_ext.llama_set_embeddings_nextn(self.handle, value, masked)
        self.exports_hidden = value

    def set_nextn_layer_offset(self, offset: int) -> None:
        from llama_cpp import llama_cpp_ext

        llama_cpp_ext.llama_set_nextn_layer_offset(self.handle, offset)

    def set_draft_vocab(self, n: int) -> int:
        """An MTP context's LM head over token ids ``[0, n)`` only (patch 0008); 0: the whole vocabulary.

        The logits past ``n`` then read -inf, so the head drafts only among
        those ids; the target still verifies over every token, so output is
        unchanged. Returns the ids the head now drafts among (``n_vocab`` for
        the whole vocabulary).

        Raises:
            ContextError: the engine was built without patch 0008.
        """
        fn = _ext_function(_SET_MTP_N_VOCAB, [ctypes.c_void_p, ctypes.c_int32], None)
        if fn is None:
            raise ContextError("this engine has no draft vocabulary (llama_set_mtp_n_vocab, patch 0008): "
                               "rebuild it with `python packaging/build_engine.py`")
        n = n if 0 < n < self.n_vocab else 0
        fn(self.handle, n)
        self.draft_vocab = n or self.n_vocab
        return self.draft_vocab

    def embeddings_nextn(self) -> Any:
        from llama_cpp import llama_cpp_ext

        return llama_cpp_ext.llama_get_embeddings_nextn(self.handle)

    def embeddings_nextn_ith(self, i: int) -> Any:
        from llama_cpp import llama_cpp_ext

        return llama_cpp_ext.llama_get_embeddings_nextn_ith(self.handle, i)

    def close(self) -> None:
        if getattr(self, "handle", None):
            self._lib.llama_free(self.handle)
            self.handle = None

    def __enter__(self) -> Context:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
