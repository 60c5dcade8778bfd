"""The sequences of a multi-sequence session, and what each keeps between its generations.

A sequence keeps its drafters (an MTP lane; an n-gram drafter with its own map
and its adaptive-depth policies, chosen from as a single session chooses:
engine/speculative/choice.py), and what the target holds for it. A new request
takes the free sequence holding the longest common prefix with its prompt and
decodes only the rest, as the single-sequence prefix cache does
(engine/generation/prefix_cache.py): the MTP lane resumes one row after the
reused ones; a hybrid's recurrent state cannot be cut back, so it is reused
where the prompt extends all of it, or from a checkpoint kept before a recent
prompt's final token (engine/generation/checkpoints.py).

Where a running sequence holds a longer start of the prompt than any free one
(an agent's requests sharing a system prompt, or clients whose next request
finds the sequence that holds its start still busy), the new one shares its
cells instead: in a unified pool a sequence can hold another's cells without
copying them (``llama_memory_seq_cp``), and the KV of a position depends only
on the tokens up to it. An MTP lane that keeps every row shares the source lane's rows the
same way in the draft context (one row past the shared cells, which it resumes
from; the source may draft with MTP alone or MTP + n-gram, whose MTP half keeps
every row: engine/speculative/reuse.py); a lazy lane starts from the prompt's newest
rows anyway; an n-gram map reads the shared tokens. Not for a hybrid (a recurrent
state is one per sequence, not per position), nor in one pool where a sliding-window
cache keeps only the window (shared cells are never let go of there:
:meth:`Sequences.can_share`). In pools of their own (``LoadOptions.kv_unified`` False)
a sequence cannot hold another's cells: it takes a copy of the other's whole pool
(all llama.cpp copies between pools) cut back to the start they share.

Requests that arrive together with one long start (sub-agents launched with one
system prompt) cannot share cells nobody has decoded yet: the multi-sequence
engine lets the later ones wait while the first reads that start, then share it
(engine/generation/parallel.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from engine.errors import ContextError
from engine.generation import state_cache
from engine.generation.checkpoints import Checkpoints
from engine.generation.prefix_cache import common_prefix
from engine.generation.session import CELL_ORDER_SENSITIVE, Session
from engine.runtime import Context
from engine.speculative.choice import DrafterChoice
from engine.speculative.depth import DepthPolicy
from engine.speculative.drafter import Drafter
from engine.speculative.reuse import begin_reusing, keeps_rows, mtp_half
from engine.speculative.rollback import PARTIAL_ONLY
from engine.speculative.settings import SpeculativeSettings

# tokens of a start another sequence holds that a sequence in a pool of its own copies rather than reads
# (the copy is of the other's whole pool: llama.cpp copies no less between pools)
COPY_MIN = 32


@dataclass(frozen=True)
class Holding:
    """What a running sequence holds: its tokens, position by position, and the rows its MTP lane holds
    exactly when that lane keeps every row (0 for a lazy lane or none)."""

    tokens: list[int]
    mtp_rows: int = 0


def shareable(tokens: list[int], holding: Holding, keeps_rows: bool) -> int:
    """How many of ``tokens``' cells a sequence may take from one that holds ``holding``: their common start
    (the last token is always decoded, for its logits); for a lane that keeps every MTP row, one fewer and
    within the source lane's exact rows, since it resumes one row after the shared ones (as in
    :meth:`Sequences.reuse`)."""
    common = common_prefix(holding.tokens, tokens)
    n = min(common, len(tokens) - 1)
    return max(0, min(n, common - 1, holding.mtp_rows - 1)) if keeps_rows else n


@dataclass
class _Memory:
    """What one sequence keeps between its generations."""

    drafters: DrafterChoice = field(default_factory=DrafterChoice)  # its own, as a single session's
    held: list[int] = field(default_factory=list)  # what the target holds for it, position by position
    mtp_held: list[int] = field(default_factory=list)  # of those, what its MTP lane holds exactly
    # a hybrid's recurrent state at its recent prompts' ends (each prompt's all but last); on a sliding-window
    # target, where the last prompt ended and (after a state from host memory) its window's cells
    checkpoints: Checkpoints = field(default_factory=Checkpoints)
    used: int = 0  # when its last generation ended (Sequences' count of ended ones; 0: never used)


class Sequences:
    """The free and busy sequences of ``session`` and their memories."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.free = list(range(session.n_seq))
        self.memory = [_Memory() for _ in range(session.n_seq)]
        self._clock = 0  # generations ended, for :attr:`_Memory.used`

    @property
    def has_room(self) -> bool:
        return bool(self.free)

    def take(self, tokens: list[int]) -> int:
        """The free sequence holding the longest common prefix with ``tokens``; of those alike, the one used
        least recently (one never used first), as llama-server picks a slot: a prompt that shares nothing
        then takes an empty sequence, or the conversation longest left alone, not the last one used."""
        seq = max(self.free, key=lambda s: (common_prefix(self.memory[s].held, tokens), -self.memory[s].used, -s))
        self.free.remove(seq)
        return seq

    def take_least(self) -> int:
        """The free sequence holding the fewest tokens (ties: the lowest): for a prompt that reuses nothing
        (one with images), so that what the others hold stays for prompts that may."""
        seq = min(self.free, key=lambda s: (len(self.memory[s].held), s))
        self.free.remove(seq)
        self.save_to_host(seq, [])
        return seq

    def give_back(self, seq: int, held: list[int] | None = None, drafter: Drafter | None = None) -> None:
        """Sequence ``seq`` is free again, holding ``held`` (None: unknown, nothing is reused)."""
        memory = self.memory[seq]
        self._clock += 1
        memory.used = self._clock
        memory.held = list(held or [])
        lane = mtp_half(drafter) if drafter is not None else None
        exact = lane.exact_end if lane is not None and held else 0
        memory.mtp_held = memory.held[:exact]
        if not held:
            memory.checkpoints.clear()
        self.free.append(seq)
        self.free.sort()

    def speculation(self, settings: SpeculativeSettings, seq: int) -> tuple[SpeculativeSettings, Drafter,
                                                                            DepthPolicy]:
        """As :meth:`Session.speculation`, with this sequence's MTP lane, drafters and policies (the
        target was prepared once for every sequence: engine/generation/parallel.py)."""
        session = self.session
        return self.memory[seq].drafters.choose(settings, session.mtp_lane(seq), session.target.threads)

    def reuse(self, seq: int, tokens: list[int], spec: SpeculativeSettings, drafter: Drafter,
              busy: Mapping[int, Holding] | None = None) -> int:
        """Keep the longest prefix of ``tokens`` sequence ``seq`` still holds, or share a longer one a running
        sequence holds (``busy``: what each holds now); start its drafter. The prompt tokens now held."""
        target, memory = self.session.target, self.memory[seq]
        self._swap(seq, tokens, spec, drafter)
        shared = self._share(seq, tokens, spec, drafter, busy or {})
        if shared:
            memory.held, memory.mtp_held = [], []
            memory.checkpoints.clear()
            self._mark_prompt_end(seq, tokens)
            return shared
        held, mtp_held, memory.held, memory.mtp_held = memory.held, memory.mtp_held, [], []
        n = min(common_prefix(held, tokens), len(tokens) - 1)
        mtp_n = max(0, common_prefix(mtp_held, tokens) - 1)  # the MTP lane resumes one row after the reused ones
        if keeps_rows(spec, drafter):  # (a lazy lane starts over from the prompt's newest rows instead)
            n = min(n, mtp_n)
        # a hybrid cannot cut its recurrent state back, and a sliding window's earlier cells may be gone (a
        # state from host memory): both go back to a checkpoint, or prefill again
        if 0 < n < len(held) and (self.session.is_hybrid or not target.keeps_window(n, seq)):
            checkpoint = memory.checkpoints.before(n)
            n = checkpoint.pos if checkpoint is not None and self._restore(seq, checkpoint.state) else 0
        # the checkpoints within what is kept still hold (a reply regenerated again goes back to it again)
        memory.checkpoints.keep_to(n)
        if n <= 0 or not target.seq_rm(n, -1, seq):
            n = 0
            memory.checkpoints.clear()
            target.seq_clear(seq)
        begin_reusing(drafter, spec, tokens[:n], keep=n + 1 if 0 < n <= mtp_n else 0)
        self._mark_prompt_end(seq, tokens)
        return n

    def save_to_host(self, seq: int, prompt: list[int]) -> None:
        """Copy what sequence ``seq`` holds, and its MTP lane's rows, to host memory where ``prompt`` would
        cut enough of it (``[]``: a prompt that reuses none of it) (engine/generation/state_cache.py)."""
        memory = self.memory[seq]
        if self.session.states.worth_saving(memory.held, prompt):
            kept = state_cache.keep(self.session.states, self.session.target, seq, memory.held, self._lane(seq),
                                    memory.mtp_held, memory.checkpoints.latest, prompt)
            if kept < len(memory.held):  # cut back to a sliding window's checkpoint
                memory.held = memory.held[:kept]
                memory.checkpoints.clear()

    def _swap(self, seq: int, tokens: list[int], spec: SpeculativeSettings, drafter: Drafter) -> None:
        """Where a saved state lets ``tokens`` reuse more than sequence ``seq`` holds, take it out; save what
        ``tokens`` cut of ``seq`` (:meth:`save_to_host`; after taking, so that saving cannot push out the very
        state coming back); bring the taken one back into ``seq``."""
        memory = self.memory[seq]
        saved = self.session.states.take(tokens, common_prefix(memory.held, tokens),
                                         follows_mtp=keeps_rows(spec, drafter))
        self.save_to_host(seq, tokens)
        if saved is None:
            return
        try:
            memory.mtp_held = state_cache.restore(saved, self.session.target, seq, self._lane(seq))
        except ContextError:
            memory.held, memory.mtp_held = [], []
            memory.checkpoints.clear()
            return
        memory.held = saved.tokens
        memory.checkpoints.hold(saved.checkpoint_pos, saved.checkpoint)

    def _lane(self, seq: int) -> tuple[Context, int] | None:
        lane = self.session.mtp_lane(seq)
        return (lane.ctx, lane.seq) if lane is not None else None

    def can_share(self) -> bool:
        """Whether a sequence may take another's cells (see the module docstring): no recurrent state, not a
        pool per sequence whose cells depend on the pool (:data:`CELL_ORDER_SENSITIVE`), and in one pool not a
        cache that keeps a sliding window's cells only. Any drafter may: an MTP lane takes the rows too (or,
        lazy, starts from the newest), an n-gram map reads the shared tokens.

        In one pool a window-only cache (``Session.window_cache``) has ``n_swa`` cells per sequence and a
        ubatch, and llama.cpp takes a cell that left the window back only while one sequence holds it:
        shared cells stay until every sharer is cut, and two sequences sharing a long prompt leave no cell
        to decode into (``llama_decode`` fails both). ``llama_memory_seq_rm`` cannot let go of them early
        either: it cuts the full-attention layers' cells with them. So there each sequence reads its own
        prompt; with ``swa_full`` (Preferences, ``--swa-full``) the pool holds every cell and they share. In
        pools of their own (``LoadOptions.kv_unified`` False) a sequence takes a copy, whose cells it alone
        holds (:meth:`share`)."""
        session = self.session
        if session.is_hybrid or session.facts.architecture in CELL_ORDER_SENSITIVE:
            return False
        return not (session.kv_unified and session.window_cache)

    def share(self, seq: int, source: int, tokens: list[int], n: int, spec: SpeculativeSettings,
              drafter: Drafter) -> None:
        """Sequence ``seq`` is emptied and holds ``source``'s first ``n`` cells, the first ``n`` of its prompt
        ``tokens``; its drafter starts, a lane that keeps every row holding ``source``'s lane's first ``n + 1``
        rows (it resumes one row after the cells), a lazy one nothing (it catches up from the newest rows), an
        n-gram map reading those tokens."""
        in_place = self.session.kv_unified
        _take(self.session.target, source, seq, n, in_place)
        rows = n + 1 if keeps_rows(spec, drafter) else 0
        lane = mtp_half(drafter)
        if rows and lane is not None:
            _take(lane.ctx, source, seq, rows, in_place)
        begin_reusing(drafter, spec, tokens[:n], keep=rows)

    def _share(self, seq: int, tokens: list[int], spec: SpeculativeSettings, drafter: Drafter,
               busy: Mapping[int, Holding]) -> int:
        """Where a running sequence holds a longer start of ``tokens`` than ``seq`` does: ``seq`` shares
        those cells (see the module docstring) and its drafter starts; how many. 0: nothing shared. (No
        free sequence holds more than ``seq``: :meth:`take` chose the free one holding most.)"""
        if not busy or not self.can_share():
            return 0
        rows = keeps_rows(spec, drafter)
        best = (seq, 0)
        for source, holding in busy.items():
            if source != seq:
                n = shareable(tokens, holding, rows)
                best = (source, n) if n > best[1] else best
        source, n = best
        gain = 1 if self.session.kv_unified else COPY_MIN  # (a whole pool's copy for a few tokens costs more)
        if n < common_prefix(self.memory[seq].held, tokens) + gain:
            return 0
        if not self.session.target.keeps_window(n, source):  # a state from host memory holds its window only
            return 0
        self.share(seq, source, tokens, n, spec, drafter)
        return n

    def save_checkpoint(self, seq: int, pos: int) -> None:
        """Keep what sequence ``seq`` cannot cut back as it is after ``pos`` prompt tokens (as
        PrefixCache.save_checkpoint)."""
        target = self.session.target
        self.memory[seq].checkpoints.save(pos, lambda into: target.state_save(seq, flags=PARTIAL_ONLY, into=into))

    def _mark_prompt_end(self, seq: int, tokens: list[int]) -> None:
        """A sliding-window target: sequence ``seq``'s prompt ends after ``len(tokens) - 1`` tokens (its all but
        last); its window's cells are copied there only if the state goes to host memory (as
        PrefixCache.mark_prompt_end)."""
        if self.session.window_checkpoints:
            self.memory[seq].checkpoints.mark(len(tokens) - 1)

    def _restore(self, seq: int, checkpoint: Any) -> bool:
        try:
            self.session.target.state_restore(checkpoint, seq, flags=PARTIAL_ONLY)
        except ContextError:
            return False
        return True


def _take(ctx: Context, source: int, seq: int, n: int, in_place: bool) -> None:
    """Sequence ``seq`` of ``ctx`` is emptied and holds ``source``'s first ``n`` cells: in one pool shared in
    place (bookkeeping only); across pools ``source``'s whole pool copied (llama.cpp copies nothing less
    between pools, on the next decode) and cut back to ``n``."""
    ctx.seq_clear(seq)
    if in_place:
        ctx.seq_cp(source, seq, 0, n)
        return
    ctx.seq_cp(source, seq, -1, -1)
    ctx.seq_rm(n, -1, seq)
