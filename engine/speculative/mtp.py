"""MTP (NextN) drafting: one looped head, or chained heads selected by offset.

Folding (one looped head): llama.cpp's driver catches the MTP context up on
every verified row, trims the rejected ones, then decodes ``id_last`` alone
to start the next draft. Here the catch-up of the *accepted* rows is deferred
and decoded in the same batch as the next ``id_last``, whose row gives the
first draft token: one MTP decode fewer per round, and rejected drafts never
enter the MTP KV cache.

That batch has several rows and one output, and some MTP graphs (glm4moe,
deepseek2/32, glm-dsa, hy_v3, cohere2moe, bailingmoe3, qwen35/35moe in
upstream's llama.cpp) export the hidden state *before* cropping to the output
rows: llama.cpp then hands back row 0 — a previous position — as the output
row's hidden state. Output stays correct (drafts are verified), but every
draft after the first is made from the wrong state. Our engine's patch
series fixes those graphs (packaging/patches/0001-mtp-crop-before-export.patch),
but rather than trust a list of graphs or a build, the drafter asks the graph
once at load (:func:`graph_crops_rows`) and folds only where the answer is exact. Chained heads have the same
hazard when a prefix is re-decoded with one output; there every row is made
an output instead, so the last row's state is the right one.

No row is decoded twice: a looped head's first draft decode writes the row of
``id_last`` at ``pos0`` with (``id_last``, ``pending_h``) — exactly the catch-up
row that position needs — so the next fold starts after it
(:attr:`MTPDrafter.skip_drafted_row`); only rows the head drafted from its own
states (the accepted drafts) are decoded again, with the target's.

The invariant everything rests on (see docs/mtp.md): the MTP input at
position p is (token x_p, h_target(p-1)), so ``pending_h`` always holds the
target's hidden state at ``pos0 - 1``, where ``pos0`` is the position of
``id_last``. It starts as zeros, becomes the last row after every catch-up
(``process``), and becomes ``verify_h[k]`` after accepting k drafts.
"""

from __future__ import annotations

import copy
import ctypes
import math
import time
from collections.abc import Generator

import numpy as np

from engine.runtime import Batch, Context, ContextParams, Model
from engine.runtime.distribution import DraftSampler
from engine.runtime.sampler import DraftGuide
from engine.speculative.draft_penalties import DraftPenalties
from engine.speculative.settings import MAX_DRAFT, SPECULATION_OFF, SpeculativeSettings

# llama.cpp's MTP driver gates a draft token by its probability in a softmax
# over the head's top 10 candidates (common/speculative.cpp); the same here,
# so a ``p_min`` taken from a llama.cpp command line means the same thing.
P_MIN_TOP_K = 10
# Rows a lazy head decodes before a draft at most: the newest of what it was not caught up on. The head's
# main input is the target's hidden state, which has read the whole context; its own attention over
# earlier rows adds little, so a window keeps drafts nearly as good while a head that drafts nothing
# costs nothing.
LAZY_WINDOW = 16
# Under a grammar the head drafts the likeliest of its top candidates the grammar allows
# (engine/runtime/sampler.py, DraftGuide); below this many, drafting stops for the round.
GUIDE_CANDIDATES = 32
# Relative difference between two hidden states that counts as "the same
# row" in the crop probe: numeric noise between batch shapes is ~1e-6..1e-3,
# a different row differs by O(1).
_SAME_ROW_RTOL = 0.05


def graph_crops_rows(ctx: Context, batch: Batch, n_embd: int, n_vocab: int) -> bool:
    """Does this MTP graph return the hidden state of the *output* rows?

    Decodes two rows with only the last an output and compares its hidden
    state with the same position decoded alone. A graph that exports the
    hidden state before cropping hands back row 0 instead. The rows differ
    in token and in hidden state, so a head that reads either tells them
    apart. Leaves the context empty.
    """
    rng = np.random.default_rng(0)
    h = rng.standard_normal((2, n_embd)).astype(np.float32)
    tokens = (n_vocab // 3, 2 * n_vocab // 3)
    row_bytes = 4 * n_embd

    def run(rows: list[tuple[int, bool]]) -> None:
        batch.clear()
        for pos, output in rows:
            batch.add(tokens[pos], pos, output)
            ctypes.memmove(batch.embd_row_address(batch.n - 1), h[pos].ctypes.data, row_bytes)
        ctx.decode(batch)

    ctx.clear()
    run([(0, False), (1, True)])
    together = np.ctypeslib.as_array(ctx.embeddings_nextn_ith(1), shape=(n_embd,)).copy()
    ctx.clear()
    run([(0, False)])
    run([(1, True)])
    alone = np.ctypeslib.as_array(ctx.embeddings_nextn_ith(0), shape=(n_embd,)).copy()
    ctx.clear()
    scale = float(np.linalg.norm(alone)) or 1.0
    return float(np.linalg.norm(together - alone)) <= _SAME_ROW_RTOL * scale


class MTPDrafter:
    """Drafts with the MTP head(s) of ``mtp_model`` (the target itself, or a sidecar).

    Args:
        target_ctx: the target context; must have ``embeddings_nextn`` enabled (unmasked).
        mtp_model: a model loaded with ``load_mtp=True`` holding the NextN block(s).
        fold: fold the catch-up into the next draft where the graph allows it exactly.
        n_threads: threads of the draft context (default: the target's). A
            draft step decodes one row through one block, so it has little to
            split between threads; on a busy machine fewer can be faster.
        n_seq: sequences the draft context holds, one per sequence of a
            multi-sequence target; :meth:`lane` gives each its own drafter.
        kv_unified: the sequences share one pool of cells, as the target's do.

    ``seconds`` holds this generation's ``draft`` and ``catch_up`` time (reset
    by :meth:`begin`); the generator books it into its statistics. The
    settings come once per generation, in :meth:`begin`, already limited to
    what this model can draft (``engine.speculative.settings.deepest_draft``).
    """

    source = "mtp"  # what proposed the drafts (statistics count accepted tokens per source)
    # A draft may go unverified (adaptive depth's shadow probe): its MTP decode wrote only
    # position pos0 with the right inputs, and the plain step's catch-up writes it again.
    shadow_probes = True
    # keep the row a looped head's first draft decode wrote at pos0 instead of decoding it again in the
    # next fold (identical inputs; tests compare drafts with it off). Off where attention depends on
    # where a cell sits, not only on what it holds (engine.generation.session.CELL_ORDER_SENSITIVE)
    skip_drafted_row = True

    def __init__(self, target_ctx: Context, mtp_model: Model, fold: bool = True, n_threads: int | None = None,
                 n_seq: int = 1, kv_unified: bool = False) -> None:
        self.target = target_ctx
        self.seq = 0  # the sequence this drafter drafts for (its rows in both contexts)
        self._owns_ctx = True
        self.model = mtp_model
        self.n_embd = mtp_model.n_embd_out
        self.n_heads = mtp_model.n_layer_nextn
        self.chained = self.n_heads > 1
        tp = target_ctx.params
        self.ctx = Context(
            mtp_model,
            ContextParams(
                n_ctx=target_ctx.n_ctx * n_seq, n_batch=tp.n_batch, n_ubatch=tp.n_ubatch,
                n_threads=n_threads or tp.n_threads, mtp=True, n_seq_max=n_seq, kv_unified=kv_unified,
                # One output row per draft step (every row of a chained prefix
                # at most) of every sequence drafting together: llama.cpp's default reserves logits for
                # n_batch rows, ~0.5 GB with a 262k vocabulary. llama.cpp reserves one per sequence at least.
                n_outputs_max=max(1, self.n_heads * n_seq),
            ),
        )
        self.ctx.set_embeddings_nextn(True, True)
        self.batch = Batch(tp.n_batch, self.n_embd)
        self._row_bytes = 4 * self.n_embd
        self._n_vocab = mtp_model.n_vocab
        self.crops_rows = graph_crops_rows(self.ctx, self.batch, self.n_embd, mtp_model.n_vocab)
        self.fold = fold and not self.chained and self.crops_rows
        self._fresh_state()

    def lane(self, seq: int) -> MTPDrafter:
        """A drafter for sequence ``seq`` of a multi-sequence target, over this one's draft context
        (the context holds every sequence's rows apart); its own batch and state."""
        lane = copy.copy(self)
        lane.seq, lane._owns_ctx = seq, False
        lane.batch = Batch(self.batch.capacity, self.n_embd)
        lane._fresh_state()
        return lane

    def _fresh_state(self) -> None:
        """The per-sequence state: what a lane does not share."""
        self.pending_h = np.zeros(self.n_embd, dtype=np.float32)
        self.verify_h = np.zeros((1, self.n_embd), dtype=np.float32)
        self.seconds = {"draft": 0.0, "catch_up": 0.0}
        self.settings = SPECULATION_OFF
        self._verified: list[int] = []
        self._verified_pos = 0
        # accepted rows whose catch-up is deferred into the next draft's first decode
        self._fold_tokens: list[int] = []
        self._deferred_step = False  # the last verify was a plain step whose catch-up waits (see verified)
        self.defer = False  # defer every catch-up (the composition drafter; see begin)
        self._fold_pos = 0
        self._fold_buf = np.zeros((self.batch.capacity, self.n_embd), dtype=np.float32)
        self._verify_buf = np.zeros((MAX_DRAFT + 1, self.n_embd), dtype=np.float32)
        # positions [0, exact_end) of the MTP context hold rows a catch-up wrote, (x_p, h_target(p-1))
        # for the target's kept tokens: the next generation may keep them (engine/generation/prefix_cache.py)
        self.exact_end = 0
        # set by the generator for a request with a grammar, for that request only
        self.guide: DraftGuide | None = None
        # set by the generator for a request under probabilistic draft sampling: drafts are sampled from
        # the head's processed distribution q, which it keeps for the target's verification (rejection.py)
        self.draft_sampler: DraftSampler | None = None
        # set by the generator for a request with repetition penalties (drafts that are the head's top token):
        # the head's rows are penalised as the target's will be (engine/speculative/draft_penalties.py)
        self.penalties: DraftPenalties | None = None
        self._forbidden = False  # this round's last draft was sampled where the grammar forbids it
        # a list while a request records its drafts: each draft's top-1 minus top-2 logit (how close
        # the head was to drafting another token; tests tell a numeric near-tie from a wrong state)
        self.draft_margins: list[float] | None = None
        self._drafted_at = -1  # pos0 of the last looped draft whose first decode wrote (id_last, pending_h) there
        self.head = 0  # chained heads: the head (layer offset) the batch drafting() last yielded is decoded with
        # catch up lazily (adaptive depth; see begin): rows wait, hidden states kept, until a draft needs
        # them, and only the newest LAZY_WINDOW are decoded then
        self.lazy = False

    # -- Drafter interface --------------------------------------------------
    def begin(self, settings: SpeculativeSettings, keep: int = 0) -> None:
        """Start a generation; ``keep``: leading MTP rows still exact for this prompt (prefix reuse),
        whose catch-up resumes with :meth:`resume` on the first prefill chunk."""
        self.settings = settings
        if keep:
            self.ctx.seq_rm(keep, -1, self.seq)
        else:
            self.ctx.seq_clear(self.seq)
        self.exact_end = keep
        self.pending_h[:] = 0.0
        self._fold_tokens = []
        self._drafted_at = -1
        self.seconds = {"draft": 0.0, "catch_up": 0.0}
        # Defer every catch-up, not only plain steps' (set by the composition
        # drafter after begin: rounds another source drafted then cost no MTP decode).
        self.defer = False
        self.lazy = catches_up_lazily(settings)

    def process(self, tokens: list[int], pos_start: int, row0: int = 0) -> None:
        """Catch the MTP context up on a target decode of ``tokens`` at ``pos_start``
        (rows ``row0..`` of the target's batch).

        Row k gets (token k, h_target(pos_start+k-1)): ``pending_h`` for the
        first row, then the target's own rows shifted right by one.
        """
        t0 = time.perf_counter()
        n = len(tokens)
        view = np.ctypeslib.as_array(self.target.embeddings_nextn_ith(row0), shape=(n, self.n_embd))
        if self.lazy:
            self._stash(tokens, pos_start, self.pending_h, view[: n - 1])
            self.pending_h[:] = view[n - 1]
            return
        self.verify_h = view.copy()  # the target overwrites its buffer on the next decode
        self._catch_up(tokens, pos_start, self.pending_h, self.verify_h[: n - 1])
        self.pending_h[:] = self.verify_h[n - 1]
        self.seconds["catch_up"] += time.perf_counter() - t0

    def resume(self, tokens: list[int], pos_start: int, row0: int = 0) -> None:
        """The first prefill chunk after a reused prefix (see :meth:`begin`'s ``keep``).

        The target decoded ``tokens`` again from ``pos_start``, whose MTP row is
        kept: its output row is h_target(pos_start), the input the next row
        needs, so the catch-up starts one row later.
        """
        t0 = time.perf_counter()
        n = len(tokens)
        view = np.ctypeslib.as_array(self.target.embeddings_nextn_ith(row0), shape=(n, self.n_embd))
        if self.lazy:  # (the row at pos_start may be missing too: the sequence is cut back when it drafts)
            if n > 1:
                self._stash(tokens[1:], pos_start + 1, view[0], view[1 : n - 1])
            self.pending_h[:] = view[n - 1]
            return
        self.verify_h = view.copy()
        if n > 1:
            self._catch_up(tokens[1:], pos_start + 1, self.verify_h[0], self.verify_h[1 : n - 1])
        self.pending_h[:] = self.verify_h[n - 1]
        self.seconds["catch_up"] += time.perf_counter() - t0

    def _catch_up(self, tokens: list[int], pos_start: int, first_h: np.ndarray, rest_h: np.ndarray) -> None:
        """Decode rows (token k, h) at ``pos_start + k``: ``first_h`` for row 0, ``rest_h[k-1]`` after."""
        n = len(tokens)
        batch = self.batch
        batch.clear()
        for k, tok in enumerate(tokens):
            batch.add(tok, pos_start + k, False, self.seq)
        base = batch.embd_row_address(0)
        ctypes.memmove(base, np.ascontiguousarray(first_h).ctypes.data, self._row_bytes)
        if n > 1:
            ctypes.memmove(base + self._row_bytes, np.ascontiguousarray(rest_h).ctypes.data,
                           self._row_bytes * (n - 1))
        for head in range(self.n_heads if self.chained else 1):
            self.ctx.seq_rm(pos_start, -1, self.seq)
            if self.chained:
                self.ctx.set_nextn_layer_offset(head)
            self.ctx.decode(batch)
        if self.chained:
            self.ctx.set_nextn_layer_offset(0)
        self._exact_to(pos_start, pos_start + n)

    def _exact_to(self, start: int, end: int) -> None:
        """Rows [start, end) were just written by a catch-up (and everything after them dropped)."""
        self.exact_end = end if start <= self.exact_end else min(self.exact_end, start)

    def _stash(self, tokens: list[int], pos_start: int, first_h: np.ndarray, rest_h: np.ndarray) -> None:
        """A lazy catch-up: rows (token k, h) at ``pos_start + k`` (``first_h`` for row 0, ``rest_h[k-1]``
        after) join the backlog instead of being decoded, which keeps only its newest rows."""
        n = len(tokens)
        window = self._window
        contiguous = self._fold_tokens and self._fold_pos + len(self._fold_tokens) == pos_start
        old = len(self._fold_tokens) if contiguous else 0
        new = min(n, window)
        skip = n - new  # leading rows of this chunk dropped
        kept_old = min(old, window - new)
        buf = self._fold_buf
        if kept_old < old:  # an overlapping move: numpy copies through a buffer
            buf[:kept_old] = buf[old - kept_old : old]
        if skip == 0:
            buf[kept_old] = first_h
            buf[kept_old + 1 : kept_old + n] = rest_h[: n - 1]
        else:
            buf[kept_old : kept_old + new] = rest_h[skip - 1 : n - 1]
        self._fold_tokens = self._fold_tokens[old - kept_old : old] + list(tokens[skip:])
        self._fold_pos = pos_start + skip - kept_old

    @property
    def _window(self) -> int:
        """The most rows a lazy catch-up decodes (what the batch holds beside a round's rows, at most)."""
        return min(LAZY_WINDOW, self.batch.capacity - MAX_DRAFT - 1)

    def probe_alone(self) -> None:
        """The next draft is a shadow probe (adaptive depth; never verified): a lazy head drafts it from its
        own row, dropping what waits rather than decoding it for a draft nobody keeps. On the bench-size
        mixture of experts a probe that also decoded the ~11 rows waiting took 7.2 ms, one of its own row
        1.7 ms (each row routes to experts of its own): probes every few steps cost what laziness saved."""
        if self.lazy:
            self._trim(0)

    def _trim(self, keep: int | None = None) -> None:
        """A lazy backlog keeps its newest ``keep`` rows (default :attr:`_window`; the older ones are never
        decoded)."""
        n = len(self._fold_tokens)
        keep = self._window if keep is None else keep
        if n > keep:
            self._fold_buf[:keep] = self._fold_buf[n - keep : n]
            self._fold_tokens = self._fold_tokens[n - keep :] if keep else []
            self._fold_pos += n - keep

    def _cut_back(self, start: int) -> None:
        """Drop what the sequence holds from ``start`` on, before rows are decoded there; all of it when
        it does not hold the row before ``start`` (a lazy catch-up dropped rows, and llama.cpp wants a
        sequence's positions consecutive: the head then attends to the rows decoded from here on)."""
        if self.lazy and start > 0 and self.ctx.seq_pos_max(self.seq) < start - 1:
            start = 0
            self.exact_end = 0
        self.ctx.seq_rm(start, -1, self.seq)

    def verified(self, tokens: list[int], pos_start: int, row0: int = 0) -> None:
        """The target just decoded ``tokens`` (a verify batch, from its row ``row0``): keep its hidden
        states before anything else decodes on the target, and catch up now
        unless folding defers it. A plain step (nothing drafted, as adaptive
        depth chooses when drafts do not pay) is deferred even without
        folding: its row is caught up in one batch with the others before
        the next draft, so a stretch of plain steps costs no MTP decodes."""
        self._deferred_step = not self.fold and (len(tokens) == 1 or self.defer or self.lazy)
        if not self.fold and not self._deferred_step:
            if self._fold_tokens:  # deferred plain steps come first (another source drafted this round)
                self.settle()
            self.process(tokens, pos_start, row0)
            return
        n = len(tokens)
        if self._verify_buf.shape[0] < n:
            self._verify_buf = np.zeros((n, self.n_embd), dtype=np.float32)
        # one copy into a kept buffer (no array view built per step: it cost more than the copy)
        ctypes.memmove(self._verify_buf.ctypes.data, self.target.embeddings_nextn_ith(row0), n * self._row_bytes)
        self.verify_h = self._verify_buf
        self._verified = tokens
        self._verified_pos = pos_start

    def draft(self, id_last: int, pos0: int, room: int) -> list[int]:
        """Up to ``n_max`` tokens after ``id_last`` (at ``pos0``), and no more
        than ``room``: what is left of the reply and the context."""
        steps = self.drafting(id_last, pos0, room)
        try:
            batch = next(steps)
            while True:
                self.ctx.decode(batch)
                batch = steps.send(0)
        except StopIteration as done:
            return list(done.value)

    def drafting(self, id_last: int, pos0: int, room: int) -> Generator[Batch, int, list[int]]:
        """:meth:`draft` in steps: each step yields the batch of rows to decode on the draft context and is
        sent the row at which they were decoded: 0 alone, or their offset where a multi-sequence engine
        decoded several sequences' rows together (engine/generation/parallel.py). Returns the drafts.
        Chained heads select their block per decode: a yielded batch is decoded with head :attr:`head`
        selected (the generator selects it before yielding; an engine decoding several lanes'
        rows together selects it itself, since every lane is then at the same step)."""
        if self._fold_tokens and not self.fold:  # deferred plain steps: caught up on their own, not folded
            self.settle()
        t0 = time.perf_counter()
        n_max, p_min = min(self.settings.n_max, room), self.settings.p_min
        if self.guide is not None:
            self.guide.start()
        if self.draft_sampler is not None:
            self.draft_sampler.start()
        self._forbidden = False
        if self.draft_margins is not None:
            self.draft_margins.clear()  # this round's only
        if self.penalties is not None:
            self.penalties.start()
        try:
            steps = self._chained_steps if self.chained else self._looped_steps
            drafts = yield from steps(id_last, pos0, n_max, p_min)
        finally:
            if self.guide is not None:
                self.guide.end()
            if self.draft_sampler is not None:
                self.draft_sampler.end()
        # a sampled draft is never dropped for its length: that would make whether token 0 is verified
        # depend on the token drawn, and rejection sampling needs every draft a plain sample of q
        if len(drafts) < self.settings.n_min and self.draft_sampler is None:
            drafts = []
        # draft rows (and a chained head's pass over pos0) are not catch-up rows; a looped head's
        # first row, (id_last, pending_h) at pos0, is one
        self.exact_end = min(self.exact_end, pos0)
        if self._drafted_at == pos0:
            self._exact_to(pos0, pos0 + 1)
        self.seconds["draft"] += time.perf_counter() - t0
        return drafts

    def accept(self, n_accepted: int, pos0: int) -> None:
        """Keep the MTP KV for accepted positions only and re-anchor ``pending_h``."""
        if self.fold or self._deferred_step:
            kept = self._verified[: n_accepted + 1]
            n = len(self._fold_tokens)
            # the row at pos0 is already in the MTP context when this round's draft wrote it (see skip_drafted_row)
            skip = self.skip_drafted_row and self._drafted_at == pos0 and not n
            if not n:
                self._fold_pos = pos0 + skip
            # written in place: rows pile up over many plain steps, and copying the pile each
            # step would cost as much as the decode (no draft ran since the last verify: they are contiguous)
            if not skip:
                self._fold_buf[n] = self.pending_h
                n += 1
            self._fold_buf[n:n + n_accepted] = self.verify_h[:n_accepted]
            self._fold_tokens.extend(kept[skip:])
            if self.lazy and len(self._fold_tokens) >= 2 * self._window:
                self._trim()  # many plain steps: only the newest rows will be decoded
            elif len(self._fold_tokens) + MAX_DRAFT + 1 >= self.batch.capacity:
                self.settle()  # many steps without a draft (adaptive depth): the batch must still hold them
        else:
            self.ctx.seq_rm(pos0 + n_accepted + 1, -1, self.seq)
            self.exact_end = min(self.exact_end, pos0 + n_accepted + 1)
        self.pending_h[:] = self.verify_h[n_accepted]

    def settle(self) -> None:
        """Decode the deferred catch-up now, without drafting.

        A composition drafter that let another source draft for many rounds
        calls it before the backlog outgrows one batch (engine/speculative/compose.py).
        """
        if self._fold_tokens:
            settle_together([self], self.batch)

    def _add_backlog(self, batch: Batch) -> None:
        """Put the deferred catch-up's rows (no outputs) in ``batch``, after what it holds."""
        start = batch.n
        for j, tok in enumerate(self._fold_tokens):
            batch.add(tok, self._fold_pos + j, False, self.seq)
        ctypes.memmove(batch.embd_row_address(start), np.ascontiguousarray(self._fold_embd).ctypes.data,
                       self._row_bytes * len(self._fold_tokens))

    @property
    def _fold_embd(self) -> np.ndarray:
        """The hidden-state rows of the deferred catch-up, one per ``_fold_tokens``."""
        return self._fold_buf[: len(self._fold_tokens)]

    @property
    def settles_at_end(self) -> bool:
        """Whether a reply's deferred catch-up is decoded as it ends, for the next prompt to reuse every
        row: always, except for a lazy head that was not drafting as the reply ended (its backlog is
        longer than a round's rows: it would pay for rows it may never draft from) or no longer holds an
        exact prefix up to its backlog (nothing to extend)."""
        if not self._fold_tokens:
            return False
        return not self.lazy or (len(self._fold_tokens) <= MAX_DRAFT + 1 and self.exact_end >= self._fold_pos)

    @property
    def backlog(self) -> int:
        """Accepted rows whose catch-up is still deferred."""
        return len(self._fold_tokens)

    @property
    def waiting_rows(self) -> int:
        """Catch-up rows a draft now would decode before its own (a lazy head keeps only its newest)."""
        return min(self.backlog, self._window) if self.lazy else self.backlog

    def close(self) -> None:
        if self._owns_ctx:  # a lane's context is its parent's
            self.ctx.close()

    # -- drafting -------------------------------------------------------------
    def _pick(self, row: int, p_min: float) -> int | None:
        """Top-1 of the head's logits (under probabilistic draft sampling: a sample of its processed
        distribution); None when the top token's probability is below ``p_min``.

        The probability is the one llama.cpp's driver gates on: a softmax over
        the top :data:`P_MIN_TOP_K` candidates (see :func:`top_probability`). The gate reads
        the row, never the sampled token: drafting stops or goes on whatever token would be
        drawn, so every draft that is verified is a plain sample of ``q``, as rejection
        sampling needs. For the same reason a sampled draft the grammar forbids is kept (the
        target rejects it) and ends the draft, rather than being dropped.
        """
        logits = np.ctypeslib.as_array(self.ctx.logits(row), shape=(self._n_vocab,))
        # under a draft vocabulary every logit past it is -inf: the greedy pick and the gate read only the
        # ids the head computed (a partition of 32,768 floats instead of 151,936)
        head = logits[:self.ctx.draft_vocab]
        if p_min > 0.0 and not passes_p_min(head, p_min):
            return None
        if self.penalties is not None and self.draft_sampler is None:
            self.penalties.apply(logits)  # the context's own buffer: read again only after the next decode
        if self.draft_sampler is not None:
            token: int | None = self.draft_sampler.sample(logits)
            if self.guide is not None and self.guide.choose([int(token)]) is None:
                self._forbidden = True
        elif self.guide is not None:  # under a grammar: the likeliest candidate it allows
            k = min(GUIDE_CANDIDATES, self._n_vocab)
            candidates = np.argpartition(logits, -k)[-k:]
            # likeliest first, ties to the lower id, as the target's greedy pick breaks them; when the
            # grammar allows none of the head's favourites, the likeliest allowed token of the whole row
            token = self.guide.choose(sorted((int(t) for t in candidates), key=lambda t: (-logits[t], t)))
            token = token if token is not None else self.guide.best(logits)
        else:
            token = int(head.argmax())
        if token is not None and self.draft_margins is not None:
            top2 = np.partition(head, -2)[-2:]
            self.draft_margins.append(float(top2[1] - top2[0]))
        if token is not None and self.penalties is not None and self.draft_sampler is None:
            self.penalties.accept(token)
        return token

    def _looped_steps(self, id_last: int, pos0: int, n_max: int, p_min: float) -> Generator[Batch, int, list[int]]:
        """One head fed its own hidden state: one single-row decode per draft token (yielded to be
        decoded, see :meth:`drafting`)."""
        drafts: list[int] = []
        batch = self.batch
        batch.clear()
        first = 0
        if self.lazy:
            self._trim()
        if self._fold_tokens:  # the deferred catch-up rides along with id_last
            self._cut_back(self._fold_pos)
            for j, tok in enumerate(self._fold_tokens):
                batch.add(tok, self._fold_pos + j, False, self.seq)
            first = len(self._fold_tokens)
            ctypes.memmove(batch.embd_row_address(0), np.ascontiguousarray(self._fold_embd).ctypes.data,
                           self._row_bytes * first)
            self._exact_to(self._fold_pos, self._fold_pos + first)  # written by the decode below
            self._fold_tokens = []
        else:
            self._cut_back(pos0)
        batch.add(id_last, pos0, True, self.seq)
        ctypes.memmove(batch.embd_row_address(first), self.pending_h.ctypes.data, self._row_bytes)
        self._drafted_at = pos0
        row = first
        while True:
            t_decode = time.perf_counter()
            offset = yield batch
            if first:  # apportion the folded decode by rows: its catch-up rows are catch-up time
                share = (time.perf_counter() - t_decode) * first / (first + 1)
                self.seconds["catch_up"] += share
                self.seconds["draft"] -= share
                first = 0
            token = self._pick(offset + row, p_min)
            row = 0
            if token is None:
                break
            drafts.append(token)
            if len(drafts) >= n_max or self._forbidden:
                break
            h_row = self.ctx.embeddings_nextn_ith(offset + batch.n - 1)
            batch.clear()
            batch.add(token, pos0 + len(drafts), True, self.seq)
            ctypes.memmove(batch.embd_row_address(0), h_row, self._row_bytes)
        return drafts

    def _chained_steps(self, id_last: int, pos0: int, n_max: int, p_min: float) -> Generator[Batch, int, list[int]]:
        """Head i drafts token i from the prefix re-decoded with its own KV layer: one decode per draft
        token, yielded to be decoded with :attr:`head` selected (see :meth:`drafting`).

        Row j of step i carries ``pending_h`` (j = 0) or the hidden state head
        j-1 produced for its draft (j > 0), as llama.cpp's driver does. Every lane
        is at the same step when a multi-sequence engine decodes their steps
        together, so one layer offset serves the whole batch.
        """
        drafts: list[int] = []
        batch = self.batch
        head_h: list[np.ndarray] = []
        # A graph that does not crop returns row 0's state for a lone
        # output row; with every row an output, the last row is right.
        every_row = not self.crops_rows
        try:
            for head in range(n_max):
                self._cut_back(pos0)
                self.ctx.set_nextn_layer_offset(head)
                self.head = head
                batch.clear()
                batch.add(id_last, pos0, head == 0 or every_row, self.seq)
                ctypes.memmove(batch.embd_row_address(0), self.pending_h.ctypes.data, self._row_bytes)
                for j, drafted in enumerate(drafts):
                    batch.add(drafted, pos0 + 1 + j, every_row or j == len(drafts) - 1, self.seq)
                    ctypes.memmove(batch.embd_row_address(j + 1), head_h[j].ctypes.data, self._row_bytes)
                last = (yield batch) + batch.n - 1
                token = self._pick(last, p_min)
                if token is None:
                    break
                drafts.append(token)
                if self._forbidden:
                    break
                h_row = self.ctx.embeddings_nextn_ith(last)
                head_h.append(np.ctypeslib.as_array(h_row, shape=(self.n_embd,)).copy())
        finally:
            self.head = 0
            self.ctx.set_nextn_layer_offset(0)
        return drafts


def catches_up_lazily(settings: SpeculativeSettings) -> bool:
    """Whether the head catches up lazily under ``settings``: adaptive depth, which may draft nothing for
    long stretches (where drafting does not pay, as on a CPU with a real vocabulary or a batch that is
    compute-bound) and would otherwise keep the head caught up on every row, prompts included, for
    drafts it never makes: then speculation cost more than none. A fixed depth drafts every round and
    keeps every row (its drafts equal llama.cpp's driver's)."""
    return settings.adaptive


def settle_together(lanes: list[MTPDrafter], batch: Batch) -> None:
    """Decode the deferred catch-up of ``lanes`` (drafters over one draft context; their backlogs fit
    ``batch``) in one decode per head: every lane's sequence is cut back to its backlog's start, then
    the rows of all are decoded together (chained heads: once with each head selected, each its own KV
    layer). :meth:`MTPDrafter.settle` is the one-lane case; a multi-sequence engine settles the lanes
    about to draft together (engine/generation/parallel.py). Each lane is booked its share of the time
    by rows."""
    first = lanes[0]
    ctx, t0 = first.ctx, time.perf_counter()
    batch.clear()
    for lane in lanes:
        if lane.lazy:
            lane._trim()
        lane._add_backlog(batch)
    for head in range(first.n_heads if first.chained else 1):
        for lane in lanes:  # (each head's decode writes the rows the next head's cuts again)
            lane._cut_back(lane._fold_pos)
        if first.chained:
            ctx.set_nextn_layer_offset(head)
        ctx.decode(batch)
    if first.chained:
        ctx.set_nextn_layer_offset(0)
    spent = time.perf_counter() - t0
    for lane in lanes:
        lane._exact_to(lane._fold_pos, lane._fold_pos + lane.backlog)
        lane.seconds["catch_up"] += spent * lane.backlog / batch.n
        lane._fold_tokens = []


def passes_p_min(logits: np.ndarray, p_min: float, k: int = P_MIN_TOP_K) -> bool:
    """``top_probability(logits, k) >= p_min``, decided from the two largest logits where they settle it.

    With a real vocabulary (151,936 to 262,144 tokens) the partition for the top ``k`` costs
    0.4-0.9 ms a draft step, more than a small head's decode. But the softmax over the top ``k``
    has the top token's probability 1 / S with 1 + e^(l2-l1) <= S <= 1 + (k-1) e^(l2-l1), where
    l1, l2 are the two largest logits: two passes over the row (argmax, then the max without it)
    settle the gate whenever the head is clearly sure or clearly unsure; only the rows in between
    pay for the partition. The answer is the same as ``top_probability``'s (tests compare them).
    ``logits`` is the context's own buffer: the top entry is masked and put back in place.
    """
    if logits.shape[0] <= k:
        return top_probability(logits, k) >= p_min
    top = int(logits.argmax())
    first = float(logits[top])
    logits[top] = -np.inf
    try:
        second = float(logits.max())
    finally:
        logits[top] = first
    gap = math.exp(second - first)
    limit = 1.0 / p_min
    if 1.0 + (k - 1) * gap <= limit:  # even the widest spread keeps the top above p_min
        return True
    if 1.0 + gap > limit:  # the runner-up alone pulls it below
        return False
    return top_probability(logits, k) >= p_min


def top_probability(logits: np.ndarray, k: int = P_MIN_TOP_K) -> float:
    """Probability of the top token in a softmax over the ``k`` largest logits."""
    top = np.partition(logits, -k)[-k:] if logits.shape[0] > k else logits
    return 1.0 / float(np.exp(top - top.max()).sum())
