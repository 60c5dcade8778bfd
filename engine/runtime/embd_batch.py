"""A ``llama_batch`` of embedding rows without token ids, each row with its own positions.

mtmd decodes an image's rows this way into the target, and on an M-RoPE
target (Qwen3.5 / 3.6) each row carries four positions (temporal, row,
column, unused), section-major: ``pos[j * n + i]`` is row i's position j. The
MTP context must receive the image rows at those same positions (issue 28),
which a token batch cannot say: llama.cpp broadcasts a token row's one
position to every section.
"""

from __future__ import annotations

import ctypes

import numpy as np

from engine.runtime import native
from engine.runtime.context import seq_id_rows


class EmbdBatch:
    """Up to ``capacity`` rows of ``n_embd`` floats, ``n_pos`` positions each; duck-types
    :class:`~engine.runtime.context.Batch` for ``Context.decode`` (``raw``, ``n``, ``n_outputs``)."""

    def __init__(self, capacity: int, n_embd: int, n_pos: int) -> None:
        lib = native.llama()
        self.capacity, self.n_embd, self.n_pos = capacity, n_embd, n_pos
        self.embd = np.zeros((capacity, n_embd), dtype=np.float32)
        self.pos = (ctypes.c_int32 * (capacity * n_pos))()
        self.n_seq_id = (ctypes.c_int32 * capacity)(*([1] * capacity))
        self._seq, self._seq_rows, self.seq_id = seq_id_rows(capacity)
        self.logits = (ctypes.c_int8 * capacity)()  # no outputs: catch-up rows
        self.raw = lib.llama_batch()
        self.raw.token = None
        self.raw.embd = self.embd.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        self.raw.pos = self.pos
        self.raw.n_seq_id = self.n_seq_id
        self.raw.seq_id = self.seq_id
        self.raw.logits = self.logits
        self.n = 0
        self.n_outputs = 0

    def fill(self, rows: np.ndarray, positions: np.ndarray, seq: int = 0) -> None:
        """``rows`` (n, n_embd) at ``positions`` (n_pos, n) of sequence ``seq``, no outputs.

        Raises:
            ValueError: more rows than the batch holds, or shapes that do not match it.
        """
        n = rows.shape[0]
        if n > self.capacity or rows.shape[1] != self.n_embd or positions.shape != (self.n_pos, n):
            raise ValueError(f"{n} rows of {rows.shape[1]} at positions {positions.shape} do not fit a batch of "
                             f"{self.capacity} x {self.n_embd} with {self.n_pos} positions a row")
        self.embd[:n] = rows
        flat = np.ascontiguousarray(positions, dtype=np.int32).reshape(-1)  # section-major for n rows
        ctypes.memmove(self.pos, flat.ctypes.data, 4 * flat.size)
        np.frombuffer(self._seq, dtype=np.int32)[:n] = seq
        self.n = n
