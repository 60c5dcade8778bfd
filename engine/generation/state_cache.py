"""Prompt states kept in host memory, so that going back to an earlier conversation reuses it.

The contexts keep one conversation per sequence (engine/generation/prefix_cache.py,
engine/generation/sequences.py): a request that parts early from what its sequence
holds cuts the rest, and coming back to that conversation prefilled all of it again
(switching between two chats in the app with one sequence: every switch paid the whole
conversation's prefill, seconds on a CPU, minutes for a long chat on a large model).
Before such a cut the sequence's state is copied to host memory
(``llama_state_seq_get_data_ext``: its KV cells and, on a hybrid, its recurrent state;
with its MTP lane's rows and a hybrid's checkpoint); a later prompt that shares a longer
start with a saved state than with what its sequence holds gets that state back
(``llama_state_seq_set_data_ext``) and decodes only the rest, as llama-server's
``--cache-ram`` does. States are dropped least recently used first, within a budget in
MiB (``LoadOptions.state_cache_mib``, ``serve --cache-ram``; at most a quarter of the
memory available once the model is loaded, less what of the model's mapped files the CPU reads).

A restored state holds the same cells, so the output is what keeping them would have
given (the same numeric noise as any prefix reuse: docs/mtp.md).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

from engine.errors import ContextError
from engine.generation.checkpoints import Checkpoint
from engine.generation.prefix_cache import PrefixCache, common_prefix
from engine.hardware.memory import available_ram_bytes
from engine.runtime import Context
from engine.speculative.rollback import PARTIAL_ONLY  # a hybrid's recurrent state, a sliding window's cells

RAM_SHARE = 4  # at most a quarter of the memory available when the model loaded
MIN_TOKENS = 64  # a state shorter than this is quicker to prefill again than worth the memory
MIN_GAIN = 32  # a saved state is brought back only if it holds this many more of the prompt's tokens
# a cut of this many tokens is saved even where the prompt keeps most of what the sequence holds: prefilling
# them again costs far more than the copy
MIN_CUT_ALWAYS = 512
FULL = 0  # llama_state_seq flags: the whole state of the sequence (cells and recurrent state)


@dataclass
class SavedState:
    """One sequence's state, copied to host memory.

    Attributes:
        tokens: what the target held, position by position.
        target: its target state (KV cells; a hybrid's recurrent state after ``tokens``).
        mtp_tokens: the tokens of the MTP lane's exact rows (empty: no MTP state kept).
        mtp: the MTP lane's state, or None.
        checkpoint: a hybrid's recurrent state, or a sliding window's cells (:func:`window_checkpoint`), as
            they were after ``checkpoint_pos`` tokens; or None.
    """

    tokens: list[int]
    target: Any
    mtp_tokens: list[int]
    mtp: Any = None
    checkpoint: Any = None
    checkpoint_pos: int = 0

    @property
    def size(self) -> int:
        return sum(len(b) for b in (self.target, self.mtp, self.checkpoint) if b is not None)


def save(target: Context, seq: int, tokens: list[int], mtp: tuple[Context, int] | None = None,
         mtp_tokens: list[int] | None = None, checkpoint: Any = None, checkpoint_pos: int = 0,
         limit: int | None = None) -> SavedState:
    """Copy sequence ``seq`` of ``target`` (and of the MTP lane ``mtp`` = (context, sequence), whose exact
    rows are ``mtp_tokens``) to host memory; ``limit``: refuse a target state larger than this many bytes
    before copying anything.

    Raises:
        ContextError: llama.cpp could not save the target's state, or it is larger than ``limit``.
    """
    if limit is not None and target.state_size(seq, flags=FULL) > limit:
        raise ContextError("the sequence's state is larger than the state cache's budget")
    state = target.state_save(seq, flags=FULL)
    mtp_state, mtp_kept = None, list(mtp_tokens or [])
    if mtp is not None and mtp_kept:
        try:
            mtp_state = mtp[0].state_save(mtp[1], flags=FULL)
        except ContextError:
            mtp_kept = []
    else:
        mtp_kept = []
    kept_checkpoint = None
    if checkpoint is not None and checkpoint_pos:  # a copy: the sequence's own buffer is written again
        kept_checkpoint = (ctypes.c_uint8 * len(checkpoint)).from_buffer_copy(checkpoint)
    return SavedState(list(tokens), state, mtp_kept, mtp_state, kept_checkpoint,
                      checkpoint_pos if kept_checkpoint is not None else 0)


def restore(saved: SavedState, target: Context, seq: int, mtp: tuple[Context, int] | None = None) -> list[int]:
    """Put ``saved`` back into sequence ``seq`` of ``target`` (replacing what it holds) and, where it kept
    them, the MTP lane's rows into ``mtp``; the tokens of the MTP lane's exact rows now (empty where its
    rows were not kept or did not restore: the lane holds nothing known then).

    Raises:
        ContextError: the target's state did not restore (the sequence is emptied).
    """
    try:
        target.state_restore(saved.target, seq, flags=FULL)
    except ContextError:
        target.seq_clear(seq)
        raise
    if mtp is None or saved.mtp is None:
        return []
    try:
        mtp[0].state_restore(saved.mtp, mtp[1], flags=FULL)
    except ContextError:
        mtp[0].seq_clear(mtp[1])
        return []
    return list(saved.mtp_tokens)


def budget(mib: int, mapped: int = 0) -> int:
    """The cache's budget in bytes: ``mib``, but no more than a :data:`RAM_SHARE` of the memory available
    now (the model is loaded: what is left is the system's and the user's other programs'), less
    ``mapped``: what of the model's files the CPU reads as it decodes (LoadPlan.host_read_bytes). The
    system counts those mapped pages as available (page cache it may drop), but a model whose pages were
    pushed out is read from disk again as it decodes, so they are not the cache's to take."""
    available = available_ram_bytes()
    cap = max(0, available - mapped) // RAM_SHARE if available is not None else mib * 2**20
    return min(mib * 2**20, cap)


class StateCache:
    """Saved states, least recently used first, within ``budget`` bytes (0: none are kept).

    ``n_swa``: the model's sliding window (0: none). llama.cpp saves a sliding-window cache's cells
    within the window only, so a state longer than the window comes back able to go on from its end but
    not to be cut back anywhere (its attention would miss the cells before the window): only to its
    :func:`window_checkpoint` at the last prompt's end, where it has one, or for a prompt that extends
    all of it (as llama-server refuses a cache without the window's cells).
    ``recurrent``: a hybrid's state goes back only to its checkpoint. For both, a longer state does not
    stand for a shorter one it begins with.
    """

    def __init__(self, budget: int, n_swa: int = 0, recurrent: bool = False) -> None:
        self.budget, self.n_swa, self.recurrent = budget, n_swa, recurrent
        self._states: list[SavedState] = []  # oldest first
        self.saved = self.restored = 0  # counts, for the statistics and the tests

    def __len__(self) -> int:
        return len(self._states)

    @property
    def used(self) -> int:
        return sum(s.size for s in self._states)

    def worth_saving(self, held: list[int], prompt: list[int]) -> bool:
        """Whether a sequence holding ``held`` should be saved before ``prompt`` cuts it: enough of it is
        lost, and no saved state already holds all of it.

        Enough is at least :data:`MIN_GAIN` tokens and either half of what it holds, as llama-server saves a
        slot to its prompt cache (``f_keep < 0.5``), or :data:`MIN_CUT_ALWAYS`. A prompt that keeps most of
        the sequence (a client's next request without the last reply, a regenerated reply) is not worth
        the copy: the copy is of the whole state, in the worker before the prompt's first decode, while
        every other sequence waits (~1.2 ms a follow-up of 76 tokens on the bench glm4moe, eight of them
        one after another when eight clients send their next requests together), for a short tail that a
        prompt would seldom come back for."""
        cut = len(held) - common_prefix(held, prompt)
        if not self.budget or len(held) < MIN_TOKENS or cut < MIN_GAIN:
            return False
        if 2 * cut <= len(held) and cut < MIN_CUT_ALWAYS:
            return False
        return not any(self._covers(s.tokens, held) for s in self._states)

    def _covers(self, longer: list[int], tokens: list[int]) -> bool:
        """Whether a state holding ``longer`` stands for one holding ``tokens``: it begins with them and can
        be cut back to them (an attention target within its sliding window, if it has one)."""
        if len(longer) < len(tokens) or common_prefix(longer, tokens) != len(tokens):
            return False
        return len(longer) == len(tokens) or not (self.recurrent or (self.n_swa and len(longer) > self.n_swa))

    def add(self, state: SavedState) -> None:
        """Keep ``state``; states it stands for go, then the oldest while over the budget."""
        if state.size > self.budget:
            return
        self._states = [s for s in self._states if not self._covers(state.tokens, s.tokens)]
        self._states.append(state)
        self.saved += 1
        while self.used > self.budget:
            self._states.pop(0)

    def take(self, prompt: list[int], have: int, follows_mtp: bool = False) -> SavedState | None:
        """The saved state that lets ``prompt`` reuse the most, taken out, if that is at least
        :data:`MIN_GAIN` more than ``have`` (what the sequence holds already); else None.

        What it lets reuse is what the caller will keep of it: the common start, but with ``follows_mtp`` (an
        MTP lane that keeps every row) no more than its MTP rows allow (one fewer than they hold), on a hybrid
        all of it or back to its checkpoint, and on a sliding window longer than the window the same."""
        best, best_n = None, have + MIN_GAIN - 1
        for s in self._states:
            n = min(common_prefix(s.tokens, prompt), len(prompt) - 1)
            if follows_mtp:
                n = min(n, common_prefix(s.mtp_tokens, prompt) - 1)
            # cut back, a hybrid's recurrent state, or a sliding window whose earlier cells were not saved, goes
            # back to its checkpoint (the last prompt's end) or not at all
            if n < len(s.tokens) and (self.recurrent or (self.n_swa and len(s.tokens) > self.n_swa)):
                n = s.checkpoint_pos if 0 < s.checkpoint_pos <= n else 0
            if n > best_n:
                best, best_n = s, n
        if best is not None:
            self._states.remove(best)
            self.restored += 1
        return best

    def clear(self) -> None:
        self._states = []


def window_checkpoint(target: Context, seq: int) -> Any:
    """The sliding-window cells of sequence ``seq`` of ``target`` (``PARTIAL_ONLY``), which the caller cut
    back to its last prompt's end after checking that the cells the window needs there are present
    (``Context.keeps_window``); None where llama.cpp refused the copy.

    Why: llama.cpp saves a sliding-window cache's cells within the window only, so a state longer than
    the window comes back from host memory able to go on from its end but not to be cut back. With this
    copy taken at the last prompt's end it can go back there, as a hybrid goes back to its checkpoint: a
    regenerated reply, or a conversation whose reply tokenizes otherwise when it is sent back (a chat
    template that drops the reasoning, a different split of the same text), reuses the whole earlier
    conversation instead of prefilling it. The cut loses nothing: it is made only where the prompt that
    cuts the sequence keeps no more than the last prompt's end (:func:`keep`), after the whole state was saved.
    """
    try:
        return target.state_save(seq, flags=PARTIAL_ONLY)
    except (ContextError, MemoryError):
        return None


def keep(states: StateCache, target: Context, seq: int, tokens: list[int], mtp: tuple[Context, int] | None,
         mtp_tokens: list[int], latest: Checkpoint | None, prompt: list[int]) -> int:
    """Save sequence ``seq`` into ``states`` if it fits the budget; a state that cannot be saved (too large,
    llama.cpp refused, no memory) is not kept and the prompt is decoded as it would have been.

    ``latest``: the sequence's latest checkpoint (checkpoints.py). On a sliding-window target whose state
    is longer than the window it is a mark of where the last prompt ended (no copy): if ``prompt`` (what
    will cut the sequence) keeps no more than that, the sequence is cut back to it and the saved state gets
    a :func:`window_checkpoint` there.
    Returns how many of ``tokens`` the sequence still holds."""
    checkpoint, checkpoint_pos = (latest.state, latest.pos) if latest is not None else (None, 0)
    try:
        saved = save(target, seq, tokens, mtp, mtp_tokens, checkpoint, checkpoint_pos, limit=states.budget)
    except (ContextError, MemoryError):
        return len(tokens)
    held = len(tokens)
    if (checkpoint is None and states.n_swa and not states.recurrent and states.n_swa < len(tokens)
            and 0 < checkpoint_pos < len(tokens)
            and min(common_prefix(tokens, prompt), len(prompt) - 1) <= checkpoint_pos  # (a regenerated reply too)
            and target.keeps_window(checkpoint_pos, seq) and target.seq_rm(checkpoint_pos, -1, seq)):
        window, held = window_checkpoint(target, seq), checkpoint_pos
        if window is not None:
            saved.checkpoint, saved.checkpoint_pos = window, checkpoint_pos
    states.add(saved)
    return held


def save_held(states: StateCache, prefix: PrefixCache, target: Context, mtp: Context | None,
              prompt: list[int]) -> None:
    """A single-sequence session: copy what ``target`` (sequence 0) holds, and the MTP context's rows, to
    ``states`` where ``prompt`` would cut enough of it (``[]``: a prompt that reuses none of it)."""
    held = prefix.held(target)
    if states.worth_saving(held, prompt):
        mtp_tokens = prefix.mtp_held(mtp)
        kept = keep(states, target, 0, held, (mtp, 0) if mtp is not None and mtp_tokens else None, mtp_tokens,
                    prefix.checkpoints.latest, prompt)
        if kept < len(held):  # cut back to a sliding window's checkpoint
            prefix.cut_to(target, kept)


def swap_held(states: StateCache, prefix: PrefixCache, target: Context, mtp: Context | None,
              prompt: list[int], follows_mtp: bool) -> None:
    """A single-sequence session, before ``prompt`` is decoded: where a saved state lets it reuse more than
    what the contexts hold, take it out; save what the prompt cuts (:func:`save_held`; after taking, so that
    saving cannot push out the very state coming back); bring the taken one back into both contexts.
    ``follows_mtp``: an MTP lane that keeps every row drafts (see :meth:`StateCache.take`)."""
    saved = states.take(prompt, common_prefix(prefix.held(target), prompt), follows_mtp)
    save_held(states, prefix, target, mtp, prompt)
    if saved is None:
        return
    try:
        mtp_tokens = restore(saved, target, 0, (mtp, 0) if mtp is not None else None)
    except ContextError:
        prefix.forget()
        return
    prefix.took_up(target, saved.tokens, mtp, mtp_tokens, saved.checkpoint, saved.checkpoint_pos)
