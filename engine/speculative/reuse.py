"""What prefix reuse needs to know of a drafter (engine/generation/prefix_cache.py, sequences.py).

A next prompt keeps an MTP context's rows where a catch-up wrote them for the same
tokens. Two drafters have such a context: the MTP drafter, and the composition of MTP
and n-gram drafting through its MTP half, which never catches up lazily and settles the
catch-up it deferred through n-gram rounds as a reply ends. The n-gram drafter reads
tokens only: it reads the reused ones again. One place says this for the single-sequence
prefill, the multi-sequence engine and its sequences' sharing, so they cannot drift apart.
"""

from __future__ import annotations

from engine.speculative.compose import ComposeDrafter
from engine.speculative.drafter import Drafter
from engine.speculative.mtp import MTPDrafter, catches_up_lazily
from engine.speculative.settings import SpeculativeSettings


def mtp_half(drafter: Drafter) -> MTPDrafter | None:
    """The MTP drafter whose context rows a next prompt may reuse: ``drafter`` itself, a composition's MTP
    half, or none (n-gram drafting, no speculation)."""
    if isinstance(drafter, MTPDrafter):
        return drafter
    return drafter.mtp if isinstance(drafter, ComposeDrafter) else None


def keeps_rows(spec: SpeculativeSettings, drafter: Drafter) -> bool:
    """An MTP lane that catches up on every row (not lazily) under ``spec``: a prompt reuses its rows (one
    more than the target's cells, as it resumes one row after them), and sharing another sequence's cells it
    shares that lane's rows too. A lazy lane (adaptive depth) starts over from the prompt's newest rows."""
    return isinstance(drafter, ComposeDrafter) or (isinstance(drafter, MTPDrafter) and not catches_up_lazily(spec))


def begin_reusing(drafter: Drafter, spec: SpeculativeSettings, reused: list[int], keep: int) -> None:
    """Start ``drafter`` on a prompt whose first tokens, ``reused``, the target context already holds: an MTP
    lane keeps its first ``keep`` rows (0: none are exact for this prompt); a drafter reading tokens reads
    the reused ones."""
    if isinstance(drafter, MTPDrafter | ComposeDrafter):
        drafter.begin(spec, keep=keep)
        if isinstance(drafter, ComposeDrafter) and reused:
            drafter.read_reused(reused)
        return
    drafter.begin(spec)
    if reused:
        drafter.process(reused, 0)


def read_prompt_chunk(drafter: Drafter, tokens: list[int], pos_start: int, row0: int = 0,
                      first_after_reused: bool = False) -> None:
    """The drafter catches up on a prompt chunk the target decoded (rows ``row0..`` of its batch). The first
    chunk after a reused prefix resumes an MTP lane one row later: its row at ``pos_start`` was kept."""
    if first_after_reused and isinstance(drafter, MTPDrafter | ComposeDrafter):
        drafter.resume(tokens, pos_start, row0)
    else:
        drafter.process(tokens, pos_start, row0)
