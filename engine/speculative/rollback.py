"""Removing rejected draft positions from the target context.

Three strategies, picked automatically from what the target is:

- ``kv``: attention-only targets; ``seq_rm`` drops the rejected cells.
- ``rs_seq``: hybrid (recurrent) targets whose architecture keeps per-token
  state snapshots (``n_rs_seq``); ``seq_rm`` rewinds to a snapshot.
- ``checkpoint``: hybrid targets without snapshot support (qwen3next on an
  llama.cpp without our packaging/patches/0004): save
  the sequence's recurrent state before verifying; after a partial accept,
  restore it and re-decode the accepted tokens.

A checkpoint is taken before every verify that carries drafts, so its cost
is paid every round (seed 002 measured ~600 of 825 ms per round on Vulkan
for a host copy into a fresh buffer). Here it stays on the device where
llama.cpp can (``LLAMA_STATE_SEQ_FLAGS_ON_DEVICE``: the state is copied into
device buffers llama.cpp keeps and reuses; only metadata comes to the host)
and falls back to one reused host buffer. The generator books all of it,
with the restore and replay, as the ``rollback`` phase.
"""

from __future__ import annotations

from typing import Any

from engine.errors import ContextError
from engine.runtime import Batch, Context

PARTIAL_ONLY = 1  # LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
ON_DEVICE = 2  # LLAMA_STATE_SEQ_FLAGS_ON_DEVICE


def choose(target: Context, hybrid: bool, n_max: int) -> str:
    if not hybrid:
        return "kv"
    return "rs_seq" if target.n_rs_seq >= n_max else "checkpoint"


class TargetRollback:
    """Applies one strategy around each verify decode."""

    def __init__(self, target: Context, strategy: str, seq: int = 0) -> None:
        self.target = target
        self.strategy = strategy
        self.seq = seq  # the sequence whose rows it rolls back (a multi-sequence context holds several)
        self._checkpoint: Any = None
        self._replay = Batch(target.params.n_batch) if strategy == "checkpoint" else None
        self.flags = PARTIAL_ONLY | ON_DEVICE  # dropped to host copies if the device path fails

    def before_verify(self, n_drafted: int) -> None:
        if self.strategy != "checkpoint" or not n_drafted:
            return
        try:
            self._checkpoint = self.target.state_save(self.seq, flags=self.flags, into=self._checkpoint)
        except ContextError:
            if self.flags == PARTIAL_ONLY:
                raise
            self.flags = PARTIAL_ONLY
            self._checkpoint = self.target.state_save(self.seq, flags=self.flags)

    def after_verify(self, verified: list[int], pos0: int, n_accepted: int) -> None:
        """Drop positions after ``pos0 + n_accepted`` (the last kept row).

        ``verified`` is the batch the target just decoded: ``[id_last, drafts...]``.
        """
        if n_accepted + 1 >= len(verified):
            return  # everything verified was kept
        keep_until = pos0 + n_accepted + 1
        if self.strategy == "checkpoint":
            self.target.state_restore(self._checkpoint, self.seq, flags=self.flags)
            if not self.target.seq_rm(pos0, -1, self.seq):
                raise ContextError("could not trim the target after restoring a checkpoint")
            replay = self._replay
            assert replay is not None
            replay.clear()
            for k in range(n_accepted + 1):
                replay.add(verified[k], pos0 + k, False, self.seq)
            self.target.decode(replay)
            return
        if not self.target.seq_rm(keep_until, -1, self.seq):
            raise ContextError(
                f"rollback ({self.strategy}) of the target to position {keep_until} failed; "
                f"the draft was longer than the context's n_rs_seq ({self.target.n_rs_seq})"
            )
