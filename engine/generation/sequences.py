"""The sequences of a multi-sequence session, and what each keeps between its generations.

A sequence keeps its drafters (an MTP lane, an n-gram drafter with its own map),
its adaptive-depth policies, and what the target holds for it. A new request
takes the free sequence holding the longest common prefix with its prompt and
decodes only the rest, as the single-sequence prefix cache does
(engine/generation/prefix_cache.py): the MTP lane resumes one row after the
reused ones; a hybrid's recurrent state cannot be cut back, so it is reused
where the prompt extends all of it, or from the checkpoint kept before the last
prompt's final token.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.errors import ContextError
from engine.generation.prefix_cache import common_prefix
from engine.generation.session import Session
from engine.speculative.adaptive import AdaptiveDepth
from engine.speculative.compose import ComposeDrafter
from engine.speculative.depth import PLAIN, DepthPolicy, FixedDepth
from engine.speculative.drafter import Drafter, PlainDrafter
from engine.speculative.mtp import MTPDrafter
from engine.speculative.ngram import NgramDrafter
from engine.speculative.rollback import PARTIAL_ONLY
from engine.speculative.settings import MAX_DRAFT, MTP, MTP_NGRAM, SPECULATION_OFF, SpeculativeSettings


@dataclass
class _Memory:
    """What one sequence keeps between its generations."""

    plain: PlainDrafter = field(default_factory=PlainDrafter)
    ngram: NgramDrafter | None = None
    composed: ComposeDrafter | None = None
    policies: dict[tuple[str, int], AdaptiveDepth] = field(default_factory=dict)
    held: list[int] = field(default_factory=list)  # what the target holds for it, position by position
    mtp_held: list[int] = field(default_factory=list)  # of those, what its MTP lane holds exactly
    # a hybrid's recurrent state after ``checkpoint_pos`` prompt tokens (the prompt's all but last)
    checkpoint: Any = None
    checkpoint_pos: int = 0


class Sequences:
    """The free and busy sequences of ``session`` and their memories."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.free = list(range(session.n_seq))
        self.memory = [_Memory() for _ in range(session.n_seq)]

    @property
    def has_room(self) -> bool:
        return bool(self.free)

    def take(self, tokens: list[int]) -> int:
        """The free sequence holding the longest common prefix with ``tokens`` (ties: the lowest)."""
        seq = max(self.free, key=lambda s: (common_prefix(self.memory[s].held, tokens), -s))
        self.free.remove(seq)
        return seq

    def give_back(self, seq: int, held: list[int] | None = None, drafter: Drafter | None = None) -> None:
        """Sequence ``seq`` is free again, holding ``held`` (None: unknown, nothing is reused)."""
        memory = self.memory[seq]
        memory.held = list(held or [])
        exact = drafter.exact_end if isinstance(drafter, MTPDrafter) and held else 0
        memory.mtp_held = memory.held[:exact]
        if not held:
            memory.checkpoint_pos = 0
        self.free.append(seq)
        self.free.sort()

    def speculation(self, settings: SpeculativeSettings, seq: int) -> tuple[SpeculativeSettings, Drafter,
                                                                            DepthPolicy]:
        """As :meth:`Session.speculation`, with this sequence's drafters and policies."""
        session, memory = self.session, self.memory[seq]
        spec = settings.limited_to(session.max_draft)
        mtp = session.mtp_lane(seq)
        drafter: Drafter | None = None
        if spec.mode == MTP:
            drafter = mtp
        elif spec.uses_ngram:
            memory.ngram = memory.ngram or NgramDrafter()
            drafter = memory.ngram
            if spec.mode == MTP_NGRAM and mtp is not None:
                memory.composed = memory.composed or ComposeDrafter(mtp, memory.ngram, session.max_draft)
                drafter = memory.composed
        if drafter is None:
            return SPECULATION_OFF, memory.plain, PLAIN
        if not spec.adaptive:
            return spec, drafter, FixedDepth(MAX_DRAFT)
        key = (spec.mode, spec.n_max)
        memory.policies.setdefault(key, AdaptiveDepth(spec.n_max))
        return spec, drafter, memory.policies[key]

    def reuse(self, seq: int, tokens: list[int], spec: SpeculativeSettings, drafter: Drafter) -> int:
        """Keep the longest prefix of ``tokens`` sequence ``seq`` still holds; start its drafter."""
        target, memory = self.session.target, self.memory[seq]
        held, mtp_held, memory.held, memory.mtp_held = memory.held, memory.mtp_held, [], []
        n = min(common_prefix(held, tokens), len(tokens) - 1)
        if isinstance(drafter, MTPDrafter):  # the MTP lane resumes one row after the reused ones
            n = min(n, max(0, common_prefix(mtp_held, tokens) - 1))
        elif spec.mode == MTP_NGRAM:
            n = 0  # the composition's MTP part starts empty, as in a single sequence
        checkpoint, memory.checkpoint_pos = memory.checkpoint_pos, 0
        if self.session.is_hybrid and n < len(held):
            n = checkpoint if 0 < checkpoint <= n and self._restore(seq, memory.checkpoint) else 0
        if n <= 0 or not target.seq_rm(n, -1, seq):
            n = 0
            target.seq_clear(seq)
        if isinstance(drafter, MTPDrafter):
            drafter.begin(spec, keep=n + 1 if n else 0)
        else:
            drafter.begin(spec)
            if n:
                drafter.process(tokens[:n], 0)  # the n-gram drafter reads tokens only
        return n

    def save_checkpoint(self, seq: int, pos: int) -> None:
        """Keep sequence ``seq``'s recurrent state as it is after ``pos`` prompt tokens (hybrids)."""
        memory = self.memory[seq]
        try:
            memory.checkpoint = self.session.target.state_save(seq, flags=PARTIAL_ONLY, into=memory.checkpoint)
            memory.checkpoint_pos = pos
        except ContextError:
            memory.checkpoint_pos = 0  # the next prompt on this sequence prefills from the start

    def _restore(self, seq: int, checkpoint: Any) -> bool:
        try:
            self.session.target.state_restore(checkpoint, seq, flags=PARTIAL_ONLY)
        except ContextError:
            return False
        return True
