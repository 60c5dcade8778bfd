"""States a sequence keeps at its recent prompts' ends, to go back to where its memory cannot be cut back.

A hybrid's recurrent state exists only at the end of the sequence, so a prompt that parts from what the
sequence holds cannot keep any of it, unless a copy of the state was taken earlier at a position the
prompt still shares: a checkpoint (``llama_state_seq_*`` partial state, as llama-server's context
checkpoints). One is taken before each prompt's last token (engine/generation/decoder.py, parallel.py).
Keeping the last prompt's alone covered a regenerated reply, but editing the last message parts before it,
and the whole conversation was prefilled again; with the one before kept too, an edited last message goes
back to the previous prompt's end and decodes only the last reply and the new message. Each costs one copy
of the recurrent state (tens to a few hundred MB on a large hybrid), so only :data:`KEEP` are kept.

A sliding-window target (Gemma 3, Step 3.5) keeps only the window's cells of its windowed layers (as
llama-server does by default): cut back by more than the slack its cache has beyond the window (a long reply
regenerated), the cells the window needs are gone. So the window's cells are copied at each prompt's end,
after its last token: cut back by that token (its cell is in the copy but not needed), the copy is the state
after the prompt's all but last, where a regenerated reply goes back to, like a hybrid's checkpoint there.
Each costs one window of the windowed layers (~8 MB on the built-in Gemma 3 270M, ~0.4 GB on a Gemma 3 27B
with its window of 1,024), against a full-size cache for those layers (at 32k tokens ~13 GB on the 27B).
Loaded with ``swa_full`` the context keeps every cell, and the "checkpoint" is only a mark of where the last
prompt ended (no copy): the window's cells are copied there when the state goes to host memory
(state_cache.window_checkpoint), and come back with it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engine.errors import ContextError
from engine.store.fit import CHECKPOINTS_KEPT

KEEP = CHECKPOINTS_KEPT  # the last prompt's end (a regenerated reply) and the one before (an edited last message)


@dataclass
class Checkpoint:
    pos: int  # the state after this many tokens
    state: Any  # its buffer; None: a sliding window's mark (no copy taken)


class Checkpoints:
    """One sequence's checkpoints, oldest first, each at a position its tokens still hold."""

    def __init__(self) -> None:
        self.kept: list[Checkpoint] = []

    def clear(self) -> None:
        self.kept = []

    @property
    def latest(self) -> Checkpoint | None:
        return self.kept[-1] if self.kept else None

    def save(self, pos: int, take: Callable[[Any], Any]) -> None:
        """Take a checkpoint after ``pos`` tokens: ``take(buffer)`` copies the state (into the buffer of the one
        it replaces, or a new one when given None). Later ones are gone (the sequence was cut before them);
        where the copy fails, the others kept stay (their tokens are unchanged; the one whose buffer was
        being written is gone). One already kept at ``pos`` stays: the same tokens lead there (what was kept is
        cut back to where the sequence still holds the same tokens: :meth:`keep_to`)."""
        if any(c.pos == pos and c.state is not None for c in self.kept):
            self.kept = [c for c in self.kept if c.pos <= pos and c.state is not None]
            return
        self.kept = [c for c in self.kept if c.pos < pos and c.state is not None]
        reuse = self.kept.pop(0).state if len(self.kept) >= KEEP else None
        try:
            self.kept.append(Checkpoint(pos, take(reuse)))
        except (ContextError, MemoryError):  # a copy llama.cpp refused, or no host memory for its buffer
            pass

    def mark(self, pos: int) -> None:
        """A sliding-window target's last prompt ends after ``pos`` tokens (no copy now)."""
        self.kept = [Checkpoint(pos, None)]

    def hold(self, pos: int, state: Any) -> None:
        """The sequence came back from host memory with this checkpoint (or none)."""
        self.kept = [Checkpoint(pos, state)] if state is not None and pos > 0 else []

    def before(self, n: int) -> Checkpoint | None:
        """The latest copied checkpoint at or before position ``n``, or None."""
        found = [c for c in self.kept if c.state is not None and 0 < c.pos <= n]
        return found[-1] if found else None

    def keep_to(self, n: int) -> None:
        """The sequence now holds its first ``n`` tokens: checkpoints past them are gone."""
        self.kept = [c for c in self.kept if c.pos <= n]
