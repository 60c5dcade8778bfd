"""MTP (NextN) drafting: one looped head, or chained heads selected by offset.

Folding (one looped head): llama.cpp's driver catches the MTP context up on
every verified row, trims the rejected ones, then decodes ``id_last`` alone
to start the next draft. Here the catch-up of the *accepted* rows is deferred
and decoded in the same batch as the next ``id_last``, whose row gives the
first draft token: one MTP decode fewer per round, and rejected drafts never
enter the MTP KV cache. It is off for qwen35/qwen35moe, whose MTP graph
returns the wrong hidden-state row when only some rows of a batch are outputs.

The invariant everything rests on (see docs/mtp.md): the MTP input at
position p is (token x_p, h_target(p-1)), so ``pending_h`` always holds the
target's hidden state at ``pos0 - 1``, where ``pos0`` is the position of
``id_last``. It starts as zeros, becomes the last row after every catch-up
(``process``), and becomes ``verify_h[k]`` after accepting k drafts.
"""

from __future__ import annotations

import ctypes
import time

import numpy as np

from engine.runtime import Batch, Context, ContextParams, Model
from engine.speculative.stats import GenerationStats

# MTP graphs that take the hidden-state rows before cropping to the output
# rows: with only some rows marked as outputs they return the wrong row.
NO_FOLD_ARCHS = frozenset({"qwen35", "qwen35moe"})


class MTPDrafter:
    """Drafts with the MTP head(s) of ``mtp_model`` (the target itself, or a sidecar).

    Args:
        target_ctx: the target context; must have ``embeddings_nextn`` enabled (unmasked).
        mtp_model: a model loaded with ``load_mtp=True`` holding the NextN block(s).
        stats: where draft and catch-up time is accounted.
    """

    def __init__(self, target_ctx: Context, mtp_model: Model, stats_ref: list[GenerationStats],
                 arch: str = "", fold: bool = True) -> None:
        self.target = target_ctx
        self.model = mtp_model
        self.n_embd = mtp_model.n_embd_out
        self.n_heads = mtp_model.n_layer_nextn
        self.chained = self.n_heads > 1
        tp = target_ctx.params
        self.ctx = Context(
            mtp_model,
            ContextParams(
                n_ctx=target_ctx.n_ctx, n_batch=tp.n_batch, n_ubatch=tp.n_ubatch,
                n_threads=tp.n_threads, mtp=True,
            ),
        )
        self.ctx.set_embeddings_nextn(True, True)
        self.batch = Batch(tp.n_batch, self.n_embd)
        self.pending_h = np.zeros(self.n_embd, dtype=np.float32)
        self.verify_h = np.zeros((1, self.n_embd), dtype=np.float32)
        self._stats_ref = stats_ref  # the generator swaps in each generation's stats
        self.fold = fold and not self.chained and arch not in NO_FOLD_ARCHS
        self._verified: list[int] = []
        self._verified_pos = 0
        # accepted rows whose catch-up is deferred into the next draft's first decode
        self._fold_tokens: list[int] = []
        self._fold_pos = 0
        self._fold_embd = np.zeros((0, self.n_embd), dtype=np.float32)
        self._row_bytes = 4 * self.n_embd
        self._n_vocab = mtp_model.n_vocab

    # -- Drafter interface --------------------------------------------------
    def begin(self) -> None:
        self.ctx.clear()
        self.pending_h[:] = 0.0
        self._fold_tokens = []

    def process(self, tokens: list[int], pos_start: int) -> None:
        """Catch the MTP context up on a target decode of ``tokens`` at ``pos_start``.

        Row k gets (token k, h_target(pos_start+k-1)): ``pending_h`` for the
        first row, then the target's own rows shifted right by one.
        """
        t0 = time.perf_counter()
        n = len(tokens)
        view = np.ctypeslib.as_array(self.target.embeddings_nextn(), shape=(n, self.n_embd))
        self.verify_h = view.copy()  # the target overwrites its buffer on the next decode
        batch = self.batch
        batch.clear()
        for k, tok in enumerate(tokens):
            batch.add(tok, pos_start + k, False)
        base = batch.embd_row_address(0)
        ctypes.memmove(base, self.pending_h.ctypes.data, self._row_bytes)
        if n > 1:
            ctypes.memmove(base + self._row_bytes, self.verify_h.ctypes.data, self._row_bytes * (n - 1))
        for head in range(self.n_heads if self.chained else 1):
            self.ctx.seq_rm(pos_start, -1)
            if self.chained:
                self.ctx.set_nextn_layer_offset(head)
            self.ctx.decode(batch)
        if self.chained:
            self.ctx.set_nextn_layer_offset(0)
        self.pending_h[:] = self.verify_h[n - 1]
        self._stats_ref[0].phase_seconds["catch_up"] += time.perf_counter() - t0

    def verified(self, tokens: list[int], pos_start: int) -> None:
        """The target just decoded ``tokens`` (a verify batch): keep its hidden
        states before anything else decodes on the target, and catch up now
        unless folding defers it."""
        if not self.fold:
            self.process(tokens, pos_start)
            return
        n = len(tokens)
        view = np.ctypeslib.as_array(self.target.embeddings_nextn(), shape=(n, self.n_embd))
        self.verify_h = view.copy()
        self._verified = tokens
        self._verified_pos = pos_start

    def draft(self, id_last: int, pos0: int, n_max: int, n_min: int, p_min: float) -> list[int]:
        t0 = time.perf_counter()
        if self.chained:
            drafts = self._draft_chained(id_last, pos0, min(n_max, self.n_heads), p_min)
        else:
            drafts = self._draft_looped(id_last, pos0, n_max, p_min)
        if len(drafts) < n_min:
            drafts = []
        self._stats_ref[0].phase_seconds["draft"] += time.perf_counter() - t0
        return drafts

    def accept(self, n_accepted: int, pos0: int) -> None:
        """Keep the MTP KV for accepted positions only and re-anchor ``pending_h``."""
        if self.fold:
            kept = self._verified[: n_accepted + 1]
            embd = np.vstack([self.pending_h[None, :], self.verify_h[:n_accepted]])
            if not self._fold_tokens:
                self._fold_pos = pos0
                self._fold_embd = embd
            else:  # no draft ran since the last verify: keep both, they are contiguous
                self._fold_embd = np.vstack([self._fold_embd, embd])
            self._fold_tokens = self._fold_tokens + kept
        else:
            self.ctx.seq_rm(pos0 + n_accepted + 1, -1)
        self.pending_h[:] = self.verify_h[n_accepted]

    def close(self) -> None:
        self.ctx.close()

    # -- drafting -------------------------------------------------------------
    def _pick(self, row: int, p_min: float) -> int | None:
        """Top-1 of the head's logits; None when its probability is below ``p_min``.

        The probability is over the whole vocabulary: a softmax over a top-k
        truncation makes the gate a no-op.
        """
        logits = np.ctypeslib.as_array(self.ctx.logits(row), shape=(self._n_vocab,))
        token = int(logits.argmax())
        if p_min > 0.0:
            top = logits[token]
            p = 1.0 / float(np.exp(logits - top).sum())
            if p < p_min:
                return None
        return token

    def _draft_looped(self, id_last: int, pos0: int, n_max: int, p_min: float) -> list[int]:
        """One head fed its own hidden state: one single-row decode per draft token."""
        drafts: list[int] = []
        batch = self.batch
        batch.clear()
        first = 0
        if self._fold_tokens:  # the deferred catch-up rides along with id_last
            self.ctx.seq_rm(self._fold_pos, -1)
            for j, tok in enumerate(self._fold_tokens):
                batch.add(tok, self._fold_pos + j, False)
            first = len(self._fold_tokens)
            ctypes.memmove(batch.embd_row_address(0), np.ascontiguousarray(self._fold_embd).ctypes.data,
                           self._row_bytes * first)
            self._fold_tokens = []
        else:
            self.ctx.seq_rm(pos0, -1)
        batch.add(id_last, pos0, True)
        ctypes.memmove(batch.embd_row_address(first), self.pending_h.ctypes.data, self._row_bytes)
        row = first
        while True:
            self.ctx.decode(batch)
            token = self._pick(row, p_min)
            row = 0
            if token is None:
                break
            drafts.append(token)
            if len(drafts) >= n_max:
                break
            h_row = self.ctx.embeddings_nextn_ith(batch.n - 1)
            batch.clear()
            batch.add(token, pos0 + len(drafts), True)
            ctypes.memmove(batch.embd_row_address(0), h_row, self._row_bytes)
        return drafts

    def _draft_chained(self, id_last: int, pos0: int, n_max: int, p_min: float) -> list[int]:
        """Head i drafts token i from the prefix re-decoded with its own KV layer.

        Row j of step i carries ``pending_h`` (j = 0) or the hidden state head
        j-1 produced for its draft (j > 0), as llama.cpp's driver does.
        """
        drafts: list[int] = []
        batch = self.batch
        head_h: list[np.ndarray] = []
        for head in range(n_max):
            self.ctx.seq_rm(pos0, -1)
            self.ctx.set_nextn_layer_offset(head)
            batch.clear()
            batch.add(id_last, pos0, head == 0)
            ctypes.memmove(batch.embd_row_address(0), self.pending_h.ctypes.data, self._row_bytes)
            for j, drafted in enumerate(drafts):
                batch.add(drafted, pos0 + 1 + j, j == len(drafts) - 1)
                ctypes.memmove(batch.embd_row_address(j + 1), head_h[j].ctypes.data, self._row_bytes)
            self.ctx.decode(batch)
            token = self._pick(batch.n - 1, p_min)
            if token is None:
                break
            drafts.append(token)
            h_row = self.ctx.embeddings_nextn_ith(batch.n - 1)
            head_h.append(np.ctypeslib.as_array(h_row, shape=(self.n_embd,)).copy())
        self.ctx.set_nextn_layer_offset(0)
        return drafts
