"""Reusing the target context's KV cache from one generation to the next.

A conversation grows by a turn at a time and a regenerated or edited reply
shares everything before it with the last request, yet clearing the context
for every generation made each turn prefill the whole conversation again
(turn 12 of a chat on the built-in model: 4.7-6.5 s to the first token
against 0.65 s at turn 1). :class:`PrefixCache` remembers which tokens the
target context holds, position by position, and the next generation keeps
the longest common prefix and decodes only the rest, as llama-server's
``cache_prompt`` does.

What can be kept depends on the memory:

- attention KV (``kv``): any prefix, by ``seq_rm``; with a sliding window, a
  state brought back from host memory holds only its window's cells, so it
  goes back only to its window checkpoint (state_cache.window_checkpoint);
- recurrent and hybrid targets: their state exists only at the end of the
  sequence. A prompt that extends everything the context holds reuses it
  all; with snapshots (``n_rs_seq``, while drafting) llama.cpp also rolls
  back within the last batch (packaging/patches/0006 refuses anything
  deeper); otherwise the cache goes back to a checkpoint of the recurrent
  state taken just before the last prompt's final token, or the one before's
  (a host copy, ``llama_state_seq_*`` partial state: checkpoints.py), as
  llama-server's context checkpoints do. That covers a regenerated reply, a
  conversation whose reply text tokenizes differently when sent back, and an
  edited last message. Any other parting clears the context and prefills
  from the start.

At least the prompt's last token is always decoded again: its logits give
the first token of the reply.

With the MTP head, the MTP context is reused too: its rows are (x_p,
h_target(p-1)), exact only for positions a catch-up wrote for the same
tokens (``MTPDrafter.exact_end``), and the hidden states of a reused prefix
are not kept. So the target keeps one row fewer than the MTP context: it
decodes position n again, which gives h_target(n), and the MTP catch-up
resumes at n + 1 (``MTPDrafter.resume``). The composition of MTP and n-gram
drafting keeps its MTP half's rows the same way (engine/speculative/reuse.py).
"""

from __future__ import annotations

from typing import Any

from engine.errors import ContextError
from engine.generation.checkpoints import Checkpoints
from engine.runtime import Context
from engine.speculative.rollback import PARTIAL_ONLY  # the recurrent part of a hybrid's memory

_CHUNK = 256  # tokens compared at a time as whole slices (C speed), before the one that differs is walked


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many tokens ``a`` and ``b`` begin with alike. Called per request for every sequence and every
    saved state (state_cache.py): long shared starts are compared a slice at a time, not token by token."""
    n = min(len(a), len(b))
    start = 0
    while start < n and a[start:start + _CHUNK] == b[start:start + _CHUNK]:
        start += _CHUNK
    for i in range(start, min(start + _CHUNK, n)):
        if a[i] != b[i]:
            return i
    return n


class PrefixCache:
    """The tokens at positions 0..n-1 of one target context, exactly as decoded and kept."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self._context: Context | None = None
        self._edits = -1
        # a hybrid's recurrent state at its recent prompts' ends; on a sliding-window target, where the last
        # prompt ended and (after a state came back from host memory) its window's cells (checkpoints.py)
        self.checkpoints = Checkpoints()
        # the MTP context: the tokens of its exact rows, trusted while it is not used otherwise
        self.mtp_tokens: list[int] = []
        self._mtp_context: Context | None = None
        self._mtp_edits = -1

    def forget(self) -> None:
        """The contexts' contents are unknown (an error, an interrupted generation)."""
        self.tokens = []
        self._context = None
        self.checkpoints.clear()
        self.mtp_tokens = []
        self._mtp_context = None

    def save_checkpoint(self, target: Context, pos: int) -> None:
        """Keep what ``target`` cannot cut back as it is after ``pos`` prompt tokens: a hybrid's recurrent state;
        a sliding window's cells (taken one token later: see checkpoints.py)."""
        self.checkpoints.save(pos, lambda into: target.state_save(flags=PARTIAL_ONLY, into=into))

    def mark_prompt_end(self, pos: int) -> None:
        """A sliding-window target: the prompt now decoded ends after ``pos`` tokens (its all but last). No copy
        is taken now: the context itself keeps every cell (``swa_full``); if the state goes to host memory, the
        window's cells are copied there then (state_cache.window_checkpoint)."""
        self.checkpoints.mark(pos)

    def cut_to(self, target: Context, n: int) -> None:
        """``target`` was cut back to its first ``n`` tokens (state_cache.keep)."""
        self.keep(target, self.tokens[:n])
        self.checkpoints.clear()

    def keep(self, target: Context, tokens: list[int]) -> None:
        """After a generation: ``target`` holds exactly ``tokens``.

        Trusted only while nothing else decodes on, trims or clears the
        context (``Context.edits``): the identity check's noise measurement,
        the benches and autotune use the target directly.
        """
        self.tokens = tokens
        self._context = target
        self._edits = target.edits

    def keep_mtp(self, ctx: Context, tokens: list[int]) -> None:
        """After a generation that drafted with MTP: ``ctx`` holds exact rows for ``tokens``."""
        self.mtp_tokens = tokens
        self._mtp_context = ctx
        self._mtp_edits = ctx.edits

    def mtp_limit(self, ctx: Context, prompt: list[int]) -> int:
        """How many target positions may be reused so that the MTP context keeps one row more."""
        if self._mtp_context is not ctx or ctx.edits != self._mtp_edits:
            return 0
        return max(0, common_prefix(self.mtp_tokens, prompt) - 1)

    def held(self, target: Context) -> list[int]:
        """What ``target`` holds as far as this cache knows (empty where it does not)."""
        return self.tokens if self._context is target and target.edits == self._edits else []

    def mtp_held(self, ctx: Context | None) -> list[int]:
        """The tokens of the MTP context's exact rows as far as this cache knows (empty where it does not)."""
        return self.mtp_tokens if ctx is not None and self._mtp_context is ctx and ctx.edits == self._mtp_edits \
            else []

    def took_up(self, target: Context, tokens: list[int], mtp: Context | None, mtp_tokens: list[int],
                checkpoint: Any, checkpoint_pos: int) -> None:
        """``target`` (and ``mtp``) hold a state brought back from host memory (state_cache.py)."""
        self.keep(target, tokens)
        if mtp is not None:
            self.keep_mtp(mtp, mtp_tokens)
        self.checkpoints.hold(checkpoint_pos, checkpoint)

    def start(self, target: Context, prompt: list[int], hybrid: bool, limit: int | None = None) -> int:
        """Make ``target`` hold the longest reusable prefix of ``prompt``; return its length.

        ``limit``: reuse no more positions than this (what the MTP context can follow).
        The context is cleared when nothing can be kept, so the caller
        prefills ``prompt[returned:]`` from the returned position either way.
        """
        held, self.tokens = self.tokens, []
        # a recreated context (hybrids switch snapshots on and off) or one used since holds something else
        same = self._context is target and target.edits == self._edits
        self._context = None
        n = min(common_prefix(held, prompt), len(prompt) - 1) if same else 0
        if limit is not None:
            n = min(n, limit)
        # a sliding window's earlier cells may be gone (a state from host memory): then back to its checkpoint
        cut_ok = n == len(held) or target.keeps_window(n)
        if n > 0 and cut_ok and (n == len(held) or target.seq_rm(n, -1)):
            self.checkpoints.keep_to(n)
            return n
        checkpoint = self.checkpoints.before(n) if hybrid or not cut_ok else None
        if checkpoint is not None:
            try:
                target.state_restore(checkpoint.state, flags=PARTIAL_ONLY)
            except ContextError:
                pass
            else:
                if target.seq_rm(checkpoint.pos, -1):  # the attention cells after it
                    # it and earlier ones still hold (a reply regenerated again goes back to it again)
                    self.checkpoints.keep_to(checkpoint.pos)
                    return checkpoint.pos
        self.checkpoints.clear()
        target.clear()
        return 0
