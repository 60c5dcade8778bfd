"""Several generations at once: one target decode verifies every running sequence's round.

A session loaded with ``LoadOptions.parallel = N`` holds N sequences in its
target and MTP contexts. Each running generation has a sequence id and its own
:class:`~engine.generation.generator.Decoder` — sampler and penalty history,
output, statistics, depth policy, rollback, and drafter (an MTP *lane* over the
shared draft context, an n-gram drafter, or the plain one). One :meth:`step`:

1. a cancelled generation ends;
2. every decoding generation proposes its round (depth — chosen together for
   sequences under adaptive depth, adaptive/batch.py — then drafts: the MTP
   lanes decode each draft step's rows together on the shared draft context,
   chained heads with that step's head selected);
3. **one** target decode verifies all their rows (``[id_last, drafts...]`` of
   each, with its sequence id), with a prompt chunk of every generation still
   reading its prompt after them, in arrival order (in pools of their own every
   row in sequence order), as much as the batch holds
   (where it cannot hold them all, the shortest rest of a prompt gets its rows
   first; a long prompt costs running replies a share of each step, not its whole
   prefill; on a model with sliding-window attention one chunk is decoded on
   its own first);
4. each samples its own rows and each reader's drafter catches up on its chunk;
   then each rolls back what it rejected, and shows what it accepted.

Each sequence's greedy output is what it would be alone: its rows attend only
to its own cells (llama.cpp masks by sequence), and everything that decides
its tokens is its own. The target is prepared once for the strongest request
(drafting, MTP) so that no request recreates a context others use.

A sequence keeps what its last generation left: a new request goes to the
free sequence holding the longest common prefix with its prompt and decodes
only the rest (a continued conversation reads only its new turn), as the
single-sequence prefix cache does; a hybrid's recurrent state is reused only
where the new prompt extends all of it.

Sequences under adaptive depth have their depths chosen together, against
the cost of the *whole* batch: a verify timed by its total rows, and shared
draft steps costing a part per step and a part per sequence in them
(adaptive/batch.py), a lazy head's waiting rows priced as the cost of entering.
What that model misses (Python around each round, resumes) a gate catches:
whole steps are timed with the policy's drafting, with none, and with every
sequence at its full depth, per number of sequences, and the best kept
(adaptive/batch_gate.py).
A request with images has its prompt decoded into its own sequence one piece
a step (a text piece, an image's encode or its decode, alone before the shared batch), so
running replies wait for one piece at a time, not for the whole prompt; then
it decodes with them. Its MTP lane catches up on the image's rows.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, replace
from typing import TypeVar

from engine.errors import ContextError
from engine.generation import chat_template, identity
from engine.generation import images as vision
from engine.generation.decoder import Decoder, PicturedPrompt, Round, ended_early, request_sampler
from engine.generation.output import Output
from engine.generation.prompt import max_prompt_chars, render_request
from engine.generation.request import (
    GenerateRequest,
    GenerateResult,
    PrefillCallback,
    ReasoningCallback,
    StatsCallback,
    TextCallback,
    TextLogprobsCallback,
)
from engine.generation.sequences import Holding, Sequences, shareable
from engine.generation.session import CELL_ORDER_SENSITIVE, LoadOptions, Session
from engine.gguf.facts import read_facts, windowed
from engine.runtime import Batch
from engine.speculative.adaptive import AdaptiveDepth, AdaptiveParams, Costs
from engine.speculative.adaptive.batch import SharedSteps, choose_depths, entry_cost
from engine.speculative.adaptive.batch_gate import FULL, POLICY, DraftingGate
from engine.speculative.drafter import Drafter
from engine.speculative.mtp import MTPDrafter, settle_together
from engine.speculative.reuse import keeps_rows, mtp_half, read_prompt_chunk
from engine.speculative.settings import MAX_DRAFT, MTP, SPECULATION_OFF, SpeculativeSettings
from engine.speculative.stats import GenerationStats

_T = TypeVar("_T")

# Adaptive depth's entry costs (_entries): the rounds a lane keeps drafting once it starts, before any was
# counted, and how fast the average follows new stretches; the rows a resuming lane would bring each round
# once drafting (its previous row and about one accepted).
STRETCH_PRIOR = 4.0
STRETCH_EMA = 0.1
RESUME_STEADY_ROWS = 2
# tokens of a prompt another sequence is reading that make a newcomer wait to share them rather than read
# them too (fewer: reading them beside it costs less than the step or two of waiting; at least what a pool of
# its own copies: sequences.COPY_MIN)
SHARE_MIN = 32


@dataclass
class Job:
    """One generation for :class:`ParallelGenerator`, with the callbacks ``generate`` takes."""

    request: GenerateRequest
    on_text: TextCallback | None = None
    on_stats: StatsCallback | None = None
    should_stop: Callable[[], bool] = lambda: False
    on_prefill: PrefillCallback | None = None
    on_reasoning: ReasoningCallback | None = None
    on_text_logprobs: TextLogprobsCallback | None = None
    # set by the generator
    seq: int = -1
    result: GenerateResult | None = None
    error: BaseException | None = None

    @property
    def done(self) -> bool:
        return self.result is not None or self.error is not None


@dataclass
class _Running:
    job: Job
    decoder: Decoder
    prompt: list[int]
    prompt_mode: str
    cursor: int = 0  # prompt tokens the sequence holds so far
    reused: int = 0  # of those, kept from its last generation
    catch_up_s: float = 0.0  # the drafter's catch-up during prefill (its own phase)
    drafting_run: int = 0  # adaptive depth: rounds drafted by choice in a row, up to now
    reading: PicturedPrompt | None = None  # a prompt with images, until its last piece is decoded
    # a sequence reading a prompt that starts as this one's, and how many tokens of it: shared once read
    waits_for: tuple[_Running, int] | None = None

    @property
    def prefilled(self) -> bool:
        return self.reading is None and self.cursor >= len(self.prompt)


class ParallelGenerator:
    """Runs up to ``session.n_seq`` generations together (see the module docstring)."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.target = session.target
        # prepared once for the strongest request: a hybrid's target context is recreated when
        # drafting starts or stops, which would drop every other sequence's cells
        session.prepare(mtp=session.mtp_drafter is not None, drafts=True)
        self.target = session.target
        session.prefix.forget()  # the single-sequence prefix cache does not describe these sequences
        self.sequences = Sequences(session)
        self.running: list[_Running] = []
        self.batch = Batch(max(self.target.n_batch, session.n_seq * (MAX_DRAFT + 1)))
        self.prefill_chunk = session.options.n_batch
        # a prompt chunk shares the verify decode with the running sequences' rows, and that decode is one
        # ubatch (decode_rows): on a sliding-window model (step35, mimo2; swa_full or not) a decode with verify
        # rows and chunks that llama.cpp split into ubatches parted replies from plain decoding far beyond
        # noise (16-token chunks: top-2 margins up to 1.6; tests/engine/test_parallel_sweep.py), and chunks
        # were read alone there for it. DeepSeek V4 still reads its chunks alone: windowed (its GGUF's window)
        # where llama_model_n_swa says 0, and its compressed attention was not checked sharing a batch
        # (gguf/facts.py windowed)
        arch = session.facts.architecture
        window = int(session.model.meta(f"{arch}.attention.sliding_window") or 0)
        self.chunks_share_batch = bool(session.model.n_swa) or not windowed(window, arch, session.model.n_layer)
        # the rows one decode carries: one ubatch at most (n_batch above 512 keeps n_ubatch at 512), which
        # holds every verify row and a newcomer's chunk beside them (the session sizes it so)
        self.decode_rows = min(self.target.n_batch, self.target.n_ubatch)
        # in pools of their own llama.cpp puts only consecutive sequence ids in one ubatch (split_equal), so
        # each step's rows go in sequence order there (in arrival order, eight sequences may decode as eight
        # graphs). One pool keeps arrival order: order does not change its graphs, but it changes where rows
        # land among the shared cells, and with it the numeric noise (a reply parted from its run alone that
        # way at a near-tie of 0.0009, within the noise along its text but not the fixed noise the identity
        # tests allow: test_seven_requests_joining_three_sequences_…)
        self.rows_by_sequence = not session.kv_unified
        # the draft steps of every MTP lane, decoded together (_draft; chained heads: one head per decode)
        mtp = session.mtp_drafter
        self.draft_batch = Batch(mtp.batch.capacity, mtp.n_embd) if mtp is not None else Batch(1)
        # the cost of a verify by its total rows, whoever's they are, and of a shared draft step (adaptive/batch.py)
        self.batch_costs = Costs(AdaptiveParams())
        self.draft_s = 0.0  # the last step's drafting, every sequence's together
        self.draft_steps = SharedSteps()  # what a shared draft step costs, per step, per sequence, per catch-up row
        self.stretch = STRETCH_PRIOR  # rounds an adaptive lane keeps drafting once it starts, on average
        self.gate = DraftingGate()  # the policy's drafting, none, or full depth: the best, timed whole per size
        self.gated: int | None = None  # the batch size the gate ruled on this step (adaptive lanes decoding)
        self.gated_drafting = False  # whether, so ruled, the policy drafted by choice this step

    @property
    def idle(self) -> bool:
        return not self.running

    @property
    def has_room(self) -> bool:
        return self.sequences.has_room

    # -- admitting ----------------------------------------------------------
    def add(self, job: Job) -> None:
        """Start ``job`` on a free sequence. A request that cannot start (its prompt does not fit,
        its template fails, it was cancelled while waiting) ends at once: ``job.done``.

        Raises:
            RuntimeError: no sequence is free (check :attr:`has_room`).
        """
        if not self.sequences.has_room:
            raise RuntimeError("every sequence is busy")
        try:
            running = self._start(job)
        except Exception as exc:
            job.error = exc
            running = None
        if running is None:
            if job.seq >= 0:
                self.sequences.give_back(job.seq)
        else:
            self.running.append(running)

    def _start(self, job: Job) -> _Running | None:
        request, session = job.request, self.session
        if request.hold_last_prompt_token:
            raise ContextError("hold_last_prompt_token is a single-sequence benchmark option")
        # after an image only the MTP head drafts (it catches up on the image's rows; docs/vision.md)
        pictured = vision.has_images(request)
        asked = SPECULATION_OFF if pictured and request.speculative.mode != MTP else \
            request.speculative.for_sampling(request.sampling.greedy)
        pictures = None
        try:
            if job.should_stop():
                raise chat_template.RenderCancelled()
            if pictured:  # rendered here, decoded below into its sequence alone
                pictures = vision.render_request(session, request, job.should_stop,
                                                 max_prompt_chars(self.target.n_ctx))
                tokens, prompt_mode, opens_thinking = [], pictures.mode, pictures.opens_thinking
            else:
                tokens, prompt_mode, opens_thinking = render_request(session, request, job.should_stop)
        except chat_template.RenderCancelled:
            stats = GenerationStats(settings=asked.limited_to(session.max_draft))
            job.result = ended_early(stats, "cancelled", chat_template.COMPLETION, job.on_stats)
            return None
        if pictures is not None:
            return self._start_pictured(job, pictures, asked, prompt_mode, opens_thinking)
        tokens = tokens or [session.model.bos]
        if len(tokens) + 1 >= self.target.n_ctx:
            raise ContextError(f"The prompt has {len(tokens)} tokens; a sequence holds {self.target.n_ctx}. "
                               "Shorten the conversation or raise the context size.")
        seq = job.seq = self.sequences.take(tokens)  # the one holding the longest start of the prompt
        decoder = self._decoder(job, seq, asked, tokens, prompt_mode, opens_thinking)
        if decoder is None:
            return None
        busy = {r.decoder.seq: _holding(r.decoder) for r in self.running if not r.decoder.pictured}
        reused = self.sequences.reuse(seq, tokens, decoder.spec, decoder.drafter, busy)
        _defer_if_unfolded(decoder.drafter)
        decoder.kept, decoder.stats.prompt_reused = tokens[:reused], reused
        if job.on_prefill is not None:
            job.on_prefill(0, len(tokens) - reused)
        running = _Running(job, decoder, tokens, prompt_mode, cursor=reused, reused=reused)
        running.waits_for = self._reader_ahead(running)
        return running

    def _reader_ahead(self, r: _Running) -> tuple[_Running, int] | None:
        """A sequence still reading a prompt whose first :data:`SHARE_MIN` tokens or more (past what ``r``
        holds) are ``r``'s too: ``r`` waits for it to read them, then shares its cells rather than decode
        them again (engine/generation/sequences.py). Requests that arrive together with one system prompt
        then read it once. None: ``r`` reads its prompt itself."""
        if not self.sequences.can_share():
            return None
        rows = keeps_rows(r.decoder.spec, r.decoder.drafter)
        best: tuple[_Running, int] | None = None
        for other in self.running:
            if other.prefilled or other.reading is not None or other.waits_for is not None:
                continue
            if rows and not keeps_rows(other.decoder.spec, other.decoder.drafter):
                continue  # its lane will not hold the rows this one's needs
            # what it will hold once read (its lane's rows as many as its cells)
            n = shareable(r.prompt, Holding(other.prompt, len(other.prompt)), rows)
            if n >= r.reused + SHARE_MIN and n > other.cursor and (best is None or n > best[1]):
                best = (other, n)
        return best

    def _share_what_was_waited_for(self) -> None:
        """Each sequence waiting for another's prompt takes its cells once they are read; one whose source
        ended first (cancelled, failed) reads its prompt itself."""
        for r in self.running:
            if r.waits_for is None:
                continue
            source, n = r.waits_for
            gone = not any(s is source for s in self.running) or source.decoder.out.finish is not None \
                or source.job.error is not None
            d = r.decoder
            if d.out.finish is not None or gone:
                r.waits_for = None
                continue
            rows = keeps_rows(d.spec, d.drafter)
            if source.cursor < n + rows:  # not read yet (a lane keeping every row resumes one row past)
                continue
            r.waits_for = None
            n = shareable(r.prompt, _holding(source.decoder), rows)  # (a deferred lane lags)
            if n <= r.reused or not self.target.keeps_window(n, source.decoder.seq):
                continue  # it reads its prompt itself (a state the source brought back from host memory holds
                # only its window's cells, and a lagging lane may leave n below where that state began)
            self.sequences.share(d.seq, source.decoder.seq, r.prompt, n, d.spec, d.drafter)
            _defer_if_unfolded(d.drafter)
            r.cursor = r.reused = d.stats.prompt_reused = n
            d.kept = r.prompt[:n]
            if r.job.on_prefill is not None:
                r.job.on_prefill(0, len(r.prompt) - n)

    def _start_pictured(self, job: Job, pictures: vision.ImagePrompt, asked: SpeculativeSettings,
                        prompt_mode: str, opens_thinking: bool) -> _Running | None:
        """A request with images: its prompt is decoded into its sequence alone, a piece a step before the
        shared batch (image chunks through the projector, at mtmd's positions; the MTP lane catches up on every
        row, image rows exactly); then it decodes with the others. Its sequence then holds nothing a later
        prompt reuses (positions run apart from cells after an image)."""
        seq = job.seq = self.sequences.take_least()
        decoder = self._decoder(job, seq, asked, [], prompt_mode, opens_thinking)
        if decoder is None:
            return None
        try:
            reading = decoder.read_pictures(pictures, job.on_prefill, job.should_stop, shared=True)
        except BaseException:
            decoder.sampler.close()
            raise
        return _Running(job, decoder, [], prompt_mode, reading=reading)

    def _decoder(self, job: Job, seq: int, asked: SpeculativeSettings, tokens: list[int], prompt_mode: str,
                 opens_thinking: bool) -> Decoder | None:
        """The decoder of ``job`` on sequence ``seq`` (its drafter and policy, sampler, output and statistics);
        None where the request asks for no tokens (``job.result`` is then set)."""
        request, session = job.request, self.session
        spec, drafter, policy = self.sequences.speculation(asked, seq)
        policy.new_reply(drafter.shadow_probes)
        stats = GenerationStats(settings=spec, rollback=session.rollback_strategy if spec.enabled else "none",
                                sequence=seq)
        stats.prompt_tokens = len(tokens)
        if request.max_tokens <= 0:
            job.result = ended_early(stats, "length", prompt_mode, job.on_stats)
            return None
        out = Output(session.model, request.stop, request.max_tokens, request.split_reasoning, job.on_text,
                     job.on_reasoning, opens_thinking, job.on_text_logprobs)
        sampler = request_sampler(session, request, tokens, opens_thinking)
        drafter.guide = sampler.draft_guide() if request.guided_drafts else None
        drafter.draft_margins = [] if request.record_drafts else None
        return Decoder(session, request, spec, drafter, policy, sampler, out, stats, seq=seq)

    # -- running --------------------------------------------------------------
    def step(self) -> list[Job]:
        """One step for every running generation (see the module docstring); the jobs that ended.

        A failed target decode fails every running job (what the context holds is unknown)."""
        for r in self.running:
            if r.decoder.out.finish is None and r.job.should_stop():
                r.decoder.out.finish = "cancelled"
        try:
            self._step()
        except Exception as exc:
            for r in self.running:
                r.job.error = exc
        return self._reap()

    def _step(self) -> None:
        """Draft for every decoding sequence, then one target decode of their verify rows and of the
        prompt chunks of the sequences still reading their prompts (as many rows as the batch holds, in
        the order _in_row_order says); then each reads its rows, and only then does anything roll back
        (a checkpoint replay decodes the target again)."""
        pictured = next((r for r in self.running if r.reading is not None and r.decoder.out.finish is None), None)
        if pictured is not None:  # one piece of a prompt with images, alone (the oldest such prompt's)
            self._read_picture_piece(pictured)
        self._share_what_was_waited_for()
        t_step = time.perf_counter()
        self.gated = None
        readers = [r for r in self.running if r.reading is None and r.waits_for is None and not r.prefilled
                   and r.decoder.out.finish is None]
        chunk_alone = bool(readers) and not self.chunks_share_batch
        if chunk_alone:  # one prompt chunk in a decode of its own
            self.batch.clear()
            alone = self._add_prompt_chunk(readers[0], self.prefill_chunk)
            t0 = time.perf_counter()
            self._decode_target([readers[0]])
            if alone is not None:
                self._read_prompt_chunks([alone], time.perf_counter() - t0)
            readers = []
        rounds = self._propose_all()
        self.batch.clear()
        # every newcomer's prompt rides along while the batch has room, as llama-server's slots do: four
        # requests arriving together all start reading now, not one per step (their first tokens came
        # a step apart each). Rows go in as _in_row_order says, the verify rows and the chunks together: in
        # pools of their own a chunk after the verify rows broke the run of sequence ids, and a step of eight
        # follow-ups read as two graphs (seqs 1-7, then 0; 57-60 ms where one graph takes 49)
        allotted = self._allot(readers, self.decode_rows - sum(1 + len(rnd.drafts) for _, rnd in rounds))
        chunks = []
        for r, part in self._in_row_order([*rounds, *allotted], lambda x: x[0]):
            if isinstance(part, Round):
                r.decoder.add_rows(part, self.batch)
            elif chunk := self._add_prompt_chunk(r, part):
                chunks.append(chunk)
        if not self.batch.n:
            return
        t0 = time.perf_counter()
        self._decode_target([r for r, _ in rounds] + [chunk[0] for chunk in chunks])
        decode_s = time.perf_counter() - t0
        for r, rnd in rounds:  # every sequence reads the decode's rows before anything decodes again
            r.decoder.sample(rnd, decode_s)
        self._read_prompt_chunks(chunks, decode_s)
        for r, rnd in rounds:
            d = r.decoder
            d.close_round(rnd)
            # its share of the batch: a sequence's policy judges when to probe by what its own rows cost
            # (the whole batch's time made a draft step look cheap beside a "verify", and at a real
            # vocabulary eight sequences probed every few steps, an LM-head row each)
            d.learn(rnd, (1 + len(rnd.drafts)) / self.batch.n)
            d.emit(rnd)
            d.tick(r.job.on_stats)
        if rounds and not chunks and not chunk_alone and pictured is None:
            # the batch's costs: a verify of its rows, its draft steps (as many as the deepest draft; what
            # each cost per step and per sequence is fitted in _draft), the rest. A step whose decode carried
            # a prompt chunk says nothing about what verify rows cost, and is not counted.
            steps = max(len(rnd.drafts) + len(rnd.shadow) for _, rnd in rounds)
            self.batch_costs.observe(self.batch.n - 1, steps, decode_s, self.draft_s,
                                     time.perf_counter() - t_step)
            if self.gated is not None:
                self.gate.observe(self.gated, sum(len(rnd.tokens) for _, rnd in rounds), time.perf_counter() - t_step,
                                  drafted=self.gated_drafting)

    def _decode_target(self, rows_of: list[_Running]) -> None:
        """One target decode of :attr:`batch` (whose rows are ``rows_of``'s), exporting the hidden states an
        MTP lane reads only where one of them has a lane. Exporting has llama.cpp run the last layer over
        every row, not only the sampled ones: on the 8-layer bench model about a tenth of a prompt's cost,
        which requests with speculation off paid for nothing (llama-server without MTP does not). Every
        other decode of the target (a checkpoint's replay, a piece of an image prompt) exports, as before."""
        plain = self.session.mtp_drafter is not None and all(mtp_half(r.decoder.drafter) is None for r in rows_of)
        if plain:
            self.target.set_embeddings_nextn(False, False)
        try:
            self.target.decode(self.batch)
        finally:
            if plain:
                self.target.set_embeddings_nextn(True, False)

    @staticmethod
    def _read_picture_piece(r: _Running) -> None:
        """Decode the next piece of ``r``'s prompt with images into its sequence (its last samples the
        first token, before anything else decodes); a piece that fails fails that request alone (an image
        the projector cannot read), as it would have failed to start."""
        assert r.reading is not None
        try:
            done = r.reading.step()
        except Exception as exc:
            r.job.error = exc
            return
        if done:
            r.reading = None
            _defer_if_unfolded(r.decoder.drafter)

    def _propose_all(self) -> list[tuple[_Running, Round]]:
        """The round of every sequence that decodes: its depth, and its drafts."""
        rooms: list[tuple[_Running, int]] = []
        for r in self.running:
            d = r.decoder
            if not r.prefilled or d.out.finish is not None:
                continue
            room = d.room()
            if room < 0:
                d.out.finish = "length"
            else:
                rooms.append((r, room))
        if not rooms:
            return []
        t_step = time.perf_counter()
        depths = self._depths(rooms)
        plans = [(r, r.decoder.policy.choose(room) if id(r) not in depths else depths[id(r)]) for r, room in rooms]
        for r, n in plans:
            r.decoder.before_draft(n)
        drafted = self._draft(plans)
        return [(r, r.decoder.drafted(*drafted[id(r)], t_step)) for r, _ in plans]

    def _allot(self, readers: list[_Running], room: int) -> list[tuple[_Running, int]]:
        """The prompt rows each reader gets this step of the ``room`` the verify rows leave, in arrival order,
        shares given out the shortest rest of a prompt first: a follow-up of a few new tokens is answered in
        the next step, not after another client's long prompt, whose reading takes the room left. One pool
        puts the chunks in the batch in arrival order: where every reader fits, the batch is the one arrival
        order fills (the cells a shared pool gives its rows, and with them the numeric noise, unchanged)."""
        rows = {}
        for r in sorted(readers, key=lambda r: len(r.prompt) - r.cursor):
            rows[id(r)] = min(self.prefill_chunk, len(r.prompt) - r.cursor, max(0, room))
            room -= rows[id(r)]
        return [(r, rows[id(r)]) for r in readers if rows[id(r)] > 0]

    def _in_row_order(self, items: list[_T], running: Callable[[_T], _Running]) -> list[_T]:
        """``items`` in the order their rows go in a batch: by sequence in pools of their own
        (:attr:`rows_by_sequence`), else as they came."""
        return sorted(items, key=lambda item: running(item).decoder.seq) if self.rows_by_sequence else items

    def _add_prompt_chunk(self, r: _Running, rows: int) -> tuple[_Running, int, int, int] | None:
        """Add the next chunk of ``r``'s prompt to the batch, after what it holds, at most ``rows`` and as
        much as the batch holds; (r, start, end, its first row), None when no row fits this step."""
        start = r.cursor
        room = min(rows, self.decode_rows - self.batch.n)
        if room <= 0:
            return None
        end = min(start + room, len(r.prompt))
        checkpoint_at = len(r.prompt) - 1 if self.session.is_hybrid else -1
        if start < checkpoint_at < end:  # a hybrid keeps its state before the prompt's last token
            end = checkpoint_at
        row0 = self.batch.n
        for k in range(start, end):
            self.batch.add(r.prompt[k], k, k == len(r.prompt) - 1, r.decoder.seq)
        return r, start, end, row0

    def _read_prompt_chunks(self, chunks: list[tuple[_Running, int, int, int]], decode_s: float) -> None:
        """After the decode of ``chunks`` (each (r, start, end, its first row)): every prompt that ended
        samples its first token, then the drafters catch up on the chunks. A catch-up is a decode of the
        head (with a fixed depth, of every row of the chunk), which no first token waits for, as a single
        sequence's does not (decoder.py); sampling changes nothing a catch-up reads."""
        t0 = time.perf_counter()
        for r, start, end, row0 in chunks:
            d = r.decoder
            d.kept.extend(r.prompt[start:end])
            r.cursor = end
            if r.job.on_prefill is not None:
                r.job.on_prefill(end - r.reused, len(r.prompt) - r.reused)
            if r.prefilled:
                d.pos0 = len(r.prompt)
                d.stats.t_first_token = time.perf_counter()
                row = row0 + end - start - 1
                d.id_last = d.sampler.sample(self.target.handle, row)
                d.out.push(d.id_last, False, d.margin(row), d.logprob(row, d.id_last))
        share = (time.perf_counter() - t0) / max(1, len(chunks))  # each chunk's part of the sampling above
        for r, start, end, row0 in chunks:
            d = r.decoder
            t1, catch_up0 = time.perf_counter(), d.drafter.seconds["catch_up"]
            read_prompt_chunk(d.drafter, r.prompt[start:end], start, row0, first_after_reused=0 < r.reused == start)
            caught_up = d.drafter.seconds["catch_up"] - catch_up0
            if self.session.is_hybrid and end == len(r.prompt) - 1:
                self.sequences.save_checkpoint(d.seq, end)
            elif self.session.window_cache and end == len(r.prompt):  # (as a single sequence's: decoder.py)
                self.sequences.save_checkpoint(d.seq, end - 1)
            d.stats.phase_seconds["prefill"] += decode_s + share + time.perf_counter() - t1 - caught_up

    def _draft(self, plans: list[tuple[_Running, int]]) -> dict[int, tuple[list[int], float]]:
        """Each sequence's drafts of ``n`` tokens at most, and its drafter's time. The MTP lanes decode
        their rows of each draft step together, in one decode of the shared draft context
        (MTPDrafter.drafting); with chained heads that decode selects the step's head, the same for
        every lane (a lane that stopped drafting is simply no longer in it). Others (n-gram, the
        composition) draft on their own.

        Sets :attr:`draft_s`, what the batch's draft steps cost: the shared decodes' time, the catch-up
        rows folded into them included (a lane brings them when it drafts; while it does not, they wait),
        and without a lane's catch-up settled before drafting; and times :attr:`draft_steps`."""
        self._settle_together([r.decoder.drafter for r, n in plans if n > 0])
        t_draft = time.perf_counter()
        self.draft_s = 0.0
        out: dict[int, tuple[list[int], float]] = {}
        steps: dict[int, tuple[_Running, Generator[Batch, int, list[int]], float]] = {}
        for r, n in plans:
            drafter, before = r.decoder.drafter, r.decoder.drafter.seconds["draft"]
            d = r.decoder
            if n <= 0:
                out[id(r)] = ([], 0.0)
            elif isinstance(drafter, MTPDrafter):
                steps[id(r)] = (r, drafter.drafting(d.id_last, d.pos0, n), before)
            else:
                out[id(r)] = (drafter.draft(d.id_last, d.pos0, n), drafter.seconds["draft"] - before)

        def advance(key: int, offset: int | None) -> Batch | None:
            r, gen, before = steps[key]
            try:
                return next(gen) if offset is None else gen.send(offset)
            except StopIteration as done:
                out[key] = (list(done.value), r.decoder.drafter.seconds["draft"] - before)
                return None

        def head(key: int) -> int:  # the head a lane's yielded rows are decoded with (chained heads)
            return steps[key][0].decoder.drafter.head

        mtp = self.session.mtp_drafter
        if not steps or mtp is None:
            self.draft_s = time.perf_counter() - t_draft
            return out
        ctx = mtp.ctx
        lanes = [0, 0, 0]  # shared decodes, the lanes in them, the rows they decoded

        def decode(batch: Batch, at: int) -> None:
            if mtp.chained:  # the lanes' generators each selected their own; another may have ended since
                ctx.set_nextn_layer_offset(at)
            ctx.decode(batch)

        # a lane that does not fold settles its catch-up as its drafting starts (in the first advance)
        pending = {key: b for key in steps if (b := advance(key, None)) is not None}
        t_loop = time.perf_counter()
        while pending:
            together, offsets = self.draft_batch, {}
            together.clear()
            shared = head(next(iter(pending)))
            for key, batch in self._in_row_order(list(pending.items()), lambda kv: steps[kv[0]][0]):
                if head(key) == shared and together.n + batch.n <= together.capacity:
                    offsets[key] = together.extend(batch)
            if together.n:
                decode(together, shared)
                lanes[0], lanes[1], lanes[2] = lanes[0] + 1, lanes[1] + len(offsets), lanes[2] + together.n
            # every lane in the shared decode reads its rows before anything decodes again; a lane that
            # did not fit (a long deferred catch-up) or needs another head decodes alone after them
            for key in [*offsets, *(k for k in pending if k not in offsets)]:
                if key not in offsets:
                    decode(pending[key], head(key))
                    lanes[0], lanes[1], lanes[2] = lanes[0] + 1, lanes[1] + 1, lanes[2] + pending[key].n
                nxt = advance(key, offsets.get(key, 0))
                if nxt is None:
                    del pending[key]
                else:
                    pending[key] = nxt
        self.draft_s = time.perf_counter() - t_loop
        # rows beyond one per lane and step are the catch-up folded into the first (chained heads: one row
        # a step, settled before)
        self.draft_steps.observe(lanes[0], lanes[1], self.draft_s, catch_up=lanes[2] - lanes[1])
        if lanes[1] > lanes[0]:  # each lane's part of the decodes it shared (its policy's view, as for verify)
            for key in steps:
                drafts, seconds = out[key]
                out[key] = (drafts, seconds * lanes[0] / lanes[1])
        return out

    def _settle_together(self, drafters: list[Drafter]) -> None:
        """The deferred catch-ups of the lanes about to draft that do not fold (chained heads), decoded
        together (engine.speculative.mtp.settle_together: one decode per head for as many lanes as the
        batch holds, not one per lane and head)."""
        lanes = [d for d in drafters if isinstance(d, MTPDrafter) and not d.fold and d.backlog]
        group: list[MTPDrafter] = []
        for lane in lanes:
            if group and sum(g.backlog for g in group) + lane.backlog > self.draft_batch.capacity:
                settle_together(group, self.draft_batch)
                group = []
            group.append(lane)
        if group:
            settle_together(group, self.draft_batch)

    def _depths(self, rooms: list[tuple[_Running, int]]) -> dict[int, int]:
        """The draft lengths of the sequences under adaptive depth, chosen together for the batch's
        total tokens per second (adaptive/batch.py); the others draft as their policy says."""
        chosen: list[tuple[_Running, AdaptiveDepth, int]] = []
        other_rows, other_tokens = 0, 0.0  # what the others add: their rows (drafts at most), their tokens
        for r, room in rooms:
            policy, stats = r.decoder.policy, r.decoder.stats
            if isinstance(policy, AdaptiveDepth):
                chosen.append((r, policy, max(0, min(policy.n_max, room))))
            else:
                other_rows += 1 + (r.decoder.spec.n_max if r.decoder.spec.enabled else 0)
                other_tokens += 1 + (stats.accepted / stats.rounds if stats.rounds else 0.0)
        if not chosen:
            return {}
        self.gated, self.gated_drafting = len(rooms), False
        mode = self.gate.mode(len(rooms))
        if mode != POLICY:  # plain steps, or every sequence as deep as it may: the better lately at this size
            taken = {}
            for r, p, cap in chosen:
                taken[id(r)] = n = p.take(cap if mode == FULL else 0, cap, probe=False)
                self._count_run(r, n > 0)
            return taken
        costs, caps = self.batch_costs, [cap for _, _, cap in chosen]
        draft = self.draft_steps.split(costs.draft_step(costs.verify(1)))
        qs = [p.acceptance.q() for _, p, _ in chosen]
        entry = self._entries([r for r, _, _ in chosen])
        depths = choose_depths(qs, caps, costs, (other_rows, other_tokens), draft, entry)
        # where even drafts always kept would not pay in this batch, learning acceptance cannot change the
        # choice: no sequence probes (each probe is a draft step, an LM-head row at a real vocabulary). Without
        # the entries: a probe drafts from its own row alone (MTPDrafter.probe_alone), the waiting rows dropped
        pays = any(depths) or any(choose_depths([[1.0] * len(q) for q in qs], caps, costs, (other_rows, other_tokens),
                                                draft))
        taken = {}
        for (r, p, cap), n in zip(chosen, depths, strict=True):
            taken[id(r)] = n = p.take(n, cap, probe=pays)
            chose = n > 0 and not p.probes.probing
            self.gated_drafting |= chose
            self._count_run(r, chose)
        return taken

    def _entries(self, lanes: list[_Running]) -> list[float]:
        """What each lane's drafting this step adds whatever its depth: the catch-up rows its lazy head decodes
        first, a resume's spread over the rounds it is expected to keep drafting (adaptive/batch.py
        entry_cost). Only for lanes that fold their catch-up into the draft decode, whose rows are timed there."""
        per_row = self.draft_steps.catch_up_row()
        out = []
        for r in lanes:
            drafter = r.decoder.drafter
            if not per_row or not isinstance(drafter, MTPDrafter) or not drafter.fold:
                out.append(0.0)
                continue
            waiting = drafter.waiting_rows
            # a lane drafting now brings its last round's rows each round; one resuming, what piled up
            steady = waiting if r.drafting_run else RESUME_STEADY_ROWS
            out.append(entry_cost(waiting, steady, self.stretch, per_row))
        return out

    def _count_run(self, r: _Running, drafts: bool) -> None:
        """Count a lane's round toward the stretches of drafting the batch's entries are spread over."""
        if drafts:
            r.drafting_run += 1
        elif r.drafting_run:
            self.stretch += STRETCH_EMA * (r.drafting_run - self.stretch)
            r.drafting_run = 0

    def _reap(self) -> list[Job]:
        ended = [r for r in self.running if r.job.error is not None or r.decoder.out.finish is not None]
        for r in ended:
            d, held = r.decoder, None
            try:
                if r.job.error is None:
                    r.job.result = d.finish(r.prompt_mode, r.job.on_stats, keep_prefix=False)
                    held = None if d.pictured else d.kept  # the next request on this sequence may start from it
            except Exception as exc:  # a callback failed while finishing
                r.job.error = exc
            finally:
                if r.reading is not None:  # cancelled or failed while its prompt with images was read
                    r.reading.close()
                d.drafter.guide = d.drafter.draft_margins = d.drafter.draft_sampler = d.drafter.penalties = None
                d.sampler.close()
                self.running.remove(r)
                self.sequences.give_back(r.job.seq, held, d.drafter)
        return [r.job for r in ended]

    def cancel_all(self, error: BaseException) -> list[Job]:
        """End every running job with ``error`` (the worker is going away)."""
        for r in self.running:
            r.job.error = error
        return self._reap()


def _holding(decoder: Decoder) -> Holding:
    """What ``decoder``'s sequence holds now, for another to share (engine/generation/sequences.py)."""
    lane = mtp_half(decoder.drafter) if keeps_rows(decoder.spec, decoder.drafter) else None
    return Holding(decoder.kept, lane.exact_end if lane is not None else 0)


def _defer_if_unfolded(drafter: Drafter) -> None:
    """After the drafter began: a lane that cannot fold (chained heads) defers every catch-up, and the engine
    decodes the lanes' backlogs together before they draft (_settle_together): per head one decode for all,
    not one per lane, and rejected drafts never decoded."""
    if isinstance(drafter, MTPDrafter) and not drafter.fold:
        drafter.defer = True


def generate_together(session: Session, requests: list[GenerateRequest], *, starts: list[int] | None = None,
                      should_stop: list[Callable[[], bool]] | None = None,
                      engine: ParallelGenerator | None = None) -> list[GenerateResult]:
    """Run ``requests`` on one multi-sequence session, request ``i`` joining at step ``starts[i]``
    (default: all at once); the results in order. For tests and benchmarks. ``engine``: the one to run
    them on, whose sequences still hold what earlier calls left (default: a new one).

    Raises:
        the first request's error, if one failed.
    """
    starts = starts or [0] * len(requests)
    stops = should_stop or [lambda: False] * len(requests)
    jobs = [Job(r, should_stop=stop) for r, stop in zip(requests, stops, strict=True)]
    engine = engine or ParallelGenerator(session)
    waiting = sorted(range(len(jobs)), key=lambda i: starts[i])
    step = 0
    while waiting or not engine.idle:
        while waiting and starts[waiting[0]] <= step and engine.has_room:
            engine.add(jobs[waiting.pop(0)])
        engine.step()
        step += 1
    for job in jobs:
        if job.error is not None:
            raise job.error
    return [job.result for job in jobs if job.result is not None]


def generate_alone(path: str, requests: list[GenerateRequest], n_seq: int, *, own_pool: bool = False,
                   n_gpu_layers: int = 0) -> tuple[list[GenerateResult], float]:
    """Each request alone, one after another, on a one-sequence session seeing the cells one sequence of an
    ``n_seq`` session sees: the shared pool, or its own (``own_pool``, a session loaded with
    ``kv_unified=False``; :data:`CELL_ORDER_SENSITIVE`: deepseek4's compressed attention depends on the size
    of the pool, not only on what it holds). With margins recorded, and the noise
    (:func:`identity.measure_noise`) of that session: what :func:`generate_together`'s replies are judged
    against, for tests and the parallel campaign (scripts/parallel_sweep.py)."""
    from engine.generation.generator import generate

    shared = read_facts(path).architecture not in CELL_ORDER_SENSITIVE and not own_pool
    with Session(LoadOptions(path=path, n_ctx=512 * n_seq if shared else 512, n_gpu_layers=n_gpu_layers)) as session:
        results = []
        for r in requests:
            if session.ngram_drafter is not None:  # each sequence's map starts with its own first request
                session.ngram_drafter.forget()
            results.append(generate(session, replace(r, record_margins=True)))
        return results, identity.measure_noise(session)
