"""The MTP context after an image: the image's rows written at the target's positions, so the
head never drafts across a gap (issue 28, item 3).

The head's input at position p is (embedding of x_p, h_target(p-1)). For a
text row the graph looks the embedding up from the token id; an image row has
no token id, only the projector's embedding row, and the 4-D M-RoPE positions
mtmd lays out. llama.cpp's MTP graphs (qwen35, qwen35moe) take an embedding
batch, but copy its one row into *both* inputs (``llm_graph_input_embd_h``:
"we assume that the hidden state is always provided as an embedding"), so an
unpatched engine can give each image row either the right embedding or the
right hidden state, never both. Patch 0007 (packaging/patches/) lets a row
carry both (engine/runtime/state_batch.py). The ways to write the rows,
measured against each other in docs/mtp.md:

- ``exact`` (the default): each image row written with its image embedding on
  the token side and h_target(p-1) as the hidden state, at the target's
  positions: the head's own input. An engine built without patch 0007 cannot
  (``state_batch.takes_states``): there ``exact`` writes the rows as ``hidden``
  does and says so (``ImageCatchUp.mode``);

- ``skip``: llama.cpp's MTP driver: image rows never reach the MTP context (a
  gap in its KV cache) and the next text row gets the stale hidden state of
  the last text row before the image;
- ``hidden``: each image row written with h_target(p-1) in both inputs, at the
  target's positions (the documented fallback: no gap, the right hidden state
  chain, the text row after the image gets h_target of the image's last row);
- ``embedding``: each image row written with its image embedding in both inputs.
"""

from __future__ import annotations

import time

import numpy as np

from engine.runtime import state_batch
from engine.runtime.embd_batch import EmbdBatch
from engine.speculative.mtp import MTPDrafter

EXACT, SKIP, HIDDEN, EMBEDDING = "exact", "skip", "hidden", "embedding"
IMAGE_ROWS = (EXACT, SKIP, HIDDEN, EMBEDDING)


class ImageCatchUp:
    """Writes an image's rows into one drafter's MTP context (its sequence: a lane of a multi-sequence
    session writes its own), piece by piece as the target decodes them."""

    def __init__(self, drafter: MTPDrafter, mode: str = EXACT) -> None:
        if mode not in IMAGE_ROWS:
            raise ValueError(f"image rows are written as one of {IMAGE_ROWS}, not {mode!r}")
        self.drafter = drafter
        if mode == EXACT and not state_batch.takes_states(drafter.ctx):
            mode = HIDDEN  # an engine without patch 0007: the closest it can do
        self.mode = mode
        self._batch: EmbdBatch | None = None

    def rows(self, embd: np.ndarray, positions: np.ndarray) -> None:
        """The target just decoded these image rows (``embd`` (n, n_embd) at ``positions`` (n_pos, n))."""
        if self.mode == SKIP:
            return
        drafter = self.drafter
        t0 = time.perf_counter()
        n = embd.shape[0]
        target_h = np.ctypeslib.as_array(drafter.target.embeddings_nextn(), shape=(n, drafter.n_embd)).copy()
        if self.mode == EMBEDDING:
            inputs = embd
        else:  # the hidden state chain: h_target(p-1) for each row
            inputs = np.concatenate([drafter.pending_h[None, :], target_h[: n - 1]])
        batch = self._batch
        if self.mode != EXACT:
            if batch is None or batch.capacity < n or batch.n_pos != positions.shape[0]:
                batch = self._batch = EmbdBatch(max(n, drafter.batch.capacity), drafter.n_embd, positions.shape[0])
            batch.fill(inputs, positions, drafter.seq)
        first = int(positions[0].min())
        for head in range(drafter.n_heads if drafter.chained else 1):
            drafter.ctx.seq_rm(first, -1, drafter.seq)
            if drafter.chained:
                drafter.ctx.set_nextn_layer_offset(head)
            if self.mode == EXACT:
                state_batch.decode_rows(drafter.ctx, embd, inputs, positions, drafter.seq)
            else:
                drafter.ctx.decode(batch)  # type: ignore[arg-type]  # an EmbdBatch decodes like a Batch
        if drafter.chained:
            drafter.ctx.set_nextn_layer_offset(0)
        drafter.exact_end = 0  # image rows are not token rows: nothing here is a prefix to reuse
        drafter.pending_h[:] = target_h[n - 1]
        drafter.seconds["catch_up"] += time.perf_counter() - t0
