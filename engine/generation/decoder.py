"""One generation's decode state and its rounds, shared by the single-sequence loop
(``generator.generate``) and the multi-sequence engine (``parallel.py``).

A round is ``propose`` (the policy's depth, the drafter's draft), ``add_rows``
(``[id_last, drafts...]`` into a verify batch, which several sequences may
share), the target's decode, ``sample`` (each row in order while drafts are
accepted; rejection sampling under probabilistic draft sampling) and
``close_round`` (keep what was accepted, roll back the rest). The prompt's
prefill reuses what the context already holds (engine/generation/prefix_cache.py).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from engine.generation import chat_template, state_cache
from engine.generation import images as vision
from engine.generation.clock import PhaseClock
from engine.generation.output import Output
from engine.generation.request import GenerateRequest, GenerateResult, PrefillCallback, StatsCallback
from engine.generation.session import Session
from engine.runtime import Batch, Sampler
from engine.speculative.depth import DepthPolicy
from engine.speculative.draft_penalties import DraftPenalties
from engine.speculative.drafter import Drafter
from engine.speculative.mtp import MTPDrafter
from engine.speculative.mtp_images import ImageCatchUp
from engine.speculative.rejection import draw, judge
from engine.speculative.reuse import begin_reusing, keeps_rows, mtp_half, read_prompt_chunk
from engine.speculative.rollback import TargetRollback
from engine.speculative.settings import MAX_DRAFT, SpeculativeSettings
from engine.speculative.stats import GenerationStats

STATS_INTERVAL_S = 0.25
# A request's grammar behind a thinking block the prompt opened: the rule the sampler starts from
AFTER_THINKING_ROOT = "mtp-studio-after-thinking"
AFTER_THINKING = f'\n{AFTER_THINKING_ROOT} ::= "</think>" [\\n]{{0,2}} root\n'


def accepts_draft(k: int, sampled: int, drafts: list[int], is_eog: Callable[[int], bool]) -> bool:
    """Is draft ``k`` accepted, given the target sampled ``sampled`` at its row?

    As llama.cpp's ``common_sampler_sample_and_accept_n``: the draft must equal
    the sample, and an end-of-generation draft counts only as the round's last
    (drafts after it would enter the context but never the output).
    """
    if k >= len(drafts) or sampled != drafts[k]:
        return False
    return not is_eog(sampled) or k == len(drafts) - 1


def top2_margin(logits_ptr: object, n_vocab: int) -> float:
    """Top-1 minus top-2 logit of one row: how far greedy was from another choice."""
    logits = np.ctypeslib.as_array(logits_ptr, shape=(n_vocab,))
    top2 = np.partition(logits, -2)[-2:]
    return float(top2[1] - top2[0])


def token_logprobs(logits_ptr: object, n_vocab: int, token: int, top: int,
                   piece: Callable[[int], bytes]) -> dict[str, Any]:
    """``token``'s log-probability in one row's raw distribution (log-softmax of the logits,
    before penalties, bias or grammar, as OpenAI reports it), and the row's ``top`` likeliest
    tokens. Under speculation the row is the verify row the token was sampled from."""
    logits = np.ctypeslib.as_array(logits_ptr, shape=(n_vocab,)).astype(np.float64)
    peak = float(logits.max())
    log_total = peak + float(np.log(np.exp(logits - peak).sum()))

    def entry(tok: int) -> dict[str, Any]:
        raw = piece(tok)
        return {"token": raw.decode("utf-8", errors="replace"), "logprob": float(logits[tok]) - log_total,
                "bytes": list(raw)}

    chosen = entry(token)
    best: list[int] = []
    if top > 0:
        picked = np.argpartition(logits, -top)[-top:]
        best = sorted((int(t) for t in picked), key=lambda t: -logits[t])
    return {**chosen, "top": [entry(t) for t in best]}


def ended_early(stats: GenerationStats, finish_reason: str, prompt_mode: str,
                 on_stats: StatsCallback | None) -> GenerateResult:
    """The result of a generation that ended before its first decode (cancelled, or max_tokens 0)."""
    stats.t_end = time.perf_counter()
    if on_stats is not None:
        on_stats(stats)
    return GenerateResult(text="", tokens=[], finish_reason=finish_reason, stats=stats, prompt_mode=prompt_mode)


def _chunks(start: int, end: int, size: int, split: int) -> list[tuple[int, int]]:
    """``[start, end)`` in pieces of at most ``size``, one of them ending at ``split`` (when inside)."""
    bounds = sorted({*range(start, end, size), *([split] if start < split < end else []), end})
    return list(zip(bounds, bounds[1:], strict=False))


class PicturedPrompt:
    """A prompt with images being decoded into a decoder's context, a piece a :meth:`step`
    (:class:`vision.PromptReader`: a text piece, an image's encode or its decode); the last step samples the
    first token.
    Positions run apart from cells from here on, and the prefix cache cannot describe the context.
    The projector's chunks are held until the prompt is read; :meth:`close` gives them back however it
    ends (a multi-sequence engine closes a reading whose request was cancelled or failed)."""

    def __init__(self, decoder: Decoder, pictures: vision.ImagePrompt, on_prefill: PrefillCallback | None,
                 should_stop: Callable[[], bool], seq: int | None) -> None:
        session, drafter = decoder.session, decoder.drafter
        assert session.projector is not None  # vision.render_request checked it
        t0 = time.perf_counter()
        self.decoder = decoder
        decoder.pictured = True
        session.save_conversation()
        session.prefix.forget()
        drafter.begin(decoder.spec)
        if isinstance(drafter, MTPDrafter):
            drafter.lazy = False  # image rows are caught up exactly, after every text row before them
        mtp = ImageCatchUp(drafter, decoder.request.image_rows) if isinstance(drafter, MTPDrafter) else None
        self.chunks: Any = session.projector.tokenize(pictures.text, pictures.images,
                                                      add_special=pictures.add_special)
        try:
            self.reader = vision.PromptReader(decoder.target, self.chunks, decoder.batch, on_prefill, should_stop,
                                              mtp, seq)
        except BaseException:
            self.close()
            raise
        self.seconds = time.perf_counter() - t0  # its own work, not the other sequences' steps between

    def step(self) -> bool:
        """Decode the next piece; whether the prompt is read (its first token sampled) or was cancelled.

        Raises:
            ProjectorError: an image failed to encode or decode (the chunks are given back).
        """
        t0 = time.perf_counter()
        try:
            done = self.reader.step()
        except BaseException:
            self.close()
            raise
        if done:
            self.close()
            d, out = self.decoder, self.reader.out
            d.sampler.accept_prompt(out.text_tokens)
            d.stats.prompt_tokens = out.n_cells
            d.pos0, d.cells_past_pos = out.n_pos, out.n_cells - out.n_pos
            d.first_token(self.seconds + time.perf_counter() - t0, out.cancelled)
        else:
            self.seconds += time.perf_counter() - t0
        return done

    def close(self) -> None:
        if self.chunks is not None:
            self.chunks.close()
            self.chunks = None


def _prefill(session: Session, drafter: Drafter, spec: SpeculativeSettings, prefill: list[int],
             batch: Batch, on_prefill: PrefillCallback | None,
             should_stop: Callable[[], bool]) -> tuple[int, list[int], bool, Callable[[], None] | None]:
    """Decode the prompt on the target, in chunks of n_batch, keeping what the last generation left.

    Returns the prompt tokens reused, the tokens the target context now holds (position by
    position), whether it was cancelled, and what is left to do after the last chunk (None:
    nothing was decoded). The drafter catches up on each chunk, on the last one only once the
    caller has sampled the reply's first token from it: that catch-up is a decode of the head
    (with a fixed depth, every prompt row), which the first token need not wait for, and
    sampling changes nothing it reads. What is reused (engine/generation/prefix_cache.py): the
    MTP head needs h_target at each position it catches up on, so its context keeps one row
    more than the target and resumes after it.
    """
    target = session.target
    lane = mtp_half(drafter)  # MTP alone, or the composition's MTP half (engine/speculative/reuse.py)
    keeps = keeps_rows(spec, drafter)
    state_cache.swap_held(session.states, session.prefix, target, session.mtp_context, prefill, follows_mtp=keeps)
    mtp_limit = 0  # target positions reusable with the MTP context one row ahead
    if lane is not None:
        mtp_limit = session.prefix.mtp_limit(lane.ctx, prefill)
        # a lazy head starts over from the prompt's newest rows where it holds less (catches_up_lazily)
        reused = session.prefix.start(target, prefill, session.is_hybrid, limit=mtp_limit if keeps else None)
    else:
        reused = session.prefix.start(target, prefill, session.is_hybrid)
    # a hybrid keeps its recurrent state from just before the prompt's last token, so a
    # regenerated reply (or a resent one that tokenizes otherwise) restarts there
    checkpoint_at = len(prefill) - 1 if session.is_hybrid and len(prefill) - 1 > reused else -1
    if session.window_checkpoints:  # a sliding window's cells are copied there only if the state goes to host memory
        session.prefix.mark_prompt_end(len(prefill) - 1)
    kept = list(prefill[:reused])
    begin_reusing(drafter, spec, kept, keep=reused + 1 if 0 < reused <= mtp_limit else 0)
    if on_prefill is not None:
        on_prefill(0, len(prefill) - reused)

    def after(chunk: list[int], start: int, end: int) -> None:
        """What follows a chunk's decode: a checkpoint where one is kept, the drafter's catch-up."""
        if end == checkpoint_at:
            session.prefix.save_checkpoint(target, end)
        elif end == len(prefill) and session.window_cache:
            # the window's cells, taken after the prompt's last token: cut back by that token they are the state
            # after the prompt's all but last, where a regenerated reply (or an edit) goes back to
            session.prefix.save_checkpoint(target, end - 1)
        read_prompt_chunk(drafter, chunk, start, first_after_reused=0 < reused == start)

    pending: Callable[[], None] | None = None
    for start, end in _chunks(reused, len(prefill), target.n_batch, checkpoint_at):
        chunk = prefill[start:end]
        batch.clear()
        for k, tok in enumerate(chunk):
            batch.add(tok, start + k, start + k == len(prefill) - 1)
        target.decode(batch)
        kept.extend(chunk)
        if end == len(prefill):  # the last: after the first token (the target's rows stay until it decodes again)
            pending = functools.partial(after, chunk, start, end)
        else:
            after(chunk, start, end)
        if on_prefill is not None:
            on_prefill(end - reused, len(prefill) - reused)
        if should_stop():
            return reused, kept, True, pending
    return reused, kept, False, pending


def _keep(session: Session, drafter: Drafter, kept: list[int]) -> None:
    """Tell the prefix cache what both contexts hold now, for the next prompt to reuse."""
    session.prefix.keep(session.target, kept)
    lane = mtp_half(drafter)
    if lane is not None:
        session.prefix.keep_mtp(lane.ctx, kept[:lane.exact_end])


def request_sampler(session: Session, request: GenerateRequest, prompt: list[int], opens_thinking: bool) -> Sampler:
    """The request's sampler, its grammar moved behind a thinking block the prompt opened."""
    grammar, triggers, root = request.grammar, request.grammar_triggers, "root"
    if grammar is not None and not triggers and opens_thinking and request.grammar_after_thinking:
        # the model thinks freely, and the grammar (a JSON schema, a forced tool call) holds the
        # answer from the closing tag on (a lazy grammar triggered there)
        grammar, triggers, root = grammar + AFTER_THINKING, (chat_template.THINK_CLOSE,), AFTER_THINKING_ROOT
    sampler = Sampler(request.sampling, session.model.n_vocab, session.target.n_ctx, vocab=session.model.vocab,
                      grammar=grammar, grammar_triggers=triggers, grammar_root=root,
                      logit_bias=dict(request.logit_bias))
    sampler.accept_prompt(prompt)
    return sampler


@dataclass
class Round:
    """One verify step: what was drafted, what the target produced, what it cost."""

    drafts: list[int]  # verified after the last token (empty: a plain step)
    shadow: list[int]  # a shadow probe's draft: compared with the plain step's token, not verified
    tokens: list[int]  # the target's samples: the accepted drafts, then its own token
    accepted: int
    margins: list[float | None]
    logprobs: list[dict[str, Any] | None]
    draft_s: float
    verify_s: float
    seconds: float = 0.0  # the whole round, drafting to rollback
    started: float = 0.0  # perf_counter() when it began
    row0: int = 0  # its first row in the verify batch (several sequences may share one)
    # probabilistic draft sampling: the drafter's processed distribution q of each draft (else empty)
    q_rows: list[np.ndarray] = field(default_factory=list)
    shadow_q: np.ndarray | None = None  # q of a sampled shadow draft
    # how likely the shadow draft was to be kept: 0 or 1 when drafts must match, min(1, p/q) when sampled
    shadow_hit: float = 0.0


class Decoder:
    """One generation's decode state: where the target stands, what it holds, what was recorded."""

    def __init__(self, session: Session, request: GenerateRequest, spec: SpeculativeSettings, drafter: Drafter,
                 policy: DepthPolicy, sampler: Sampler, out: Output, stats: GenerationStats, seq: int = 0) -> None:
        self.session, self.request, self.spec = session, request, spec
        self.drafter, self.policy, self.sampler, self.out, self.stats = drafter, policy, sampler, out, stats
        self.target, self.model = session.target, session.model
        self.seq = seq  # its sequence in the contexts (a multi-sequence session holds several)
        self.rollback = TargetRollback(self.target, session.rollback_strategy if spec.enabled else "kv", seq)
        self.batch = Batch(max(self.target.n_batch, MAX_DRAFT + 1))
        self.clock = PhaseClock(stats.phase_seconds)
        self.kept: list[int] = []  # what the target context holds, position by position
        self.pos0 = 0  # the position of id_last
        # KV cells beyond positions: an image takes a cell per row but fewer positions (M-RoPE)
        self.cells_past_pos = 0
        self.pictured = False  # the prompt had images: the prefix cache cannot describe the context
        self.id_last = -1
        self.result = GenerateResult(text="", tokens=[], finish_reason="stop", stats=stats)
        self.last_stats = time.perf_counter()
        # probabilistic draft sampling (a sampled request): the drafter samples its drafts from q, and
        # each round's drafts are judged by rejection sampling (engine/speculative/rejection.py)
        self.draft_sampler = sampler.draft_sampler() if spec.probabilistic and not request.sampling.greedy else None
        drafter.draft_sampler = self.draft_sampler
        # repetition penalties: the head's rows are penalised as the target's (engine/speculative/draft_penalties.py)
        drafter.penalties = DraftPenalties.of(request.sampling, self.target.n_ctx,
                                              lambda: [*self.kept[-request.sampling.repeat_last_n - 1:], self.id_last])

    def prefill(self, tokens: list[int], on_prefill: PrefillCallback | None, should_stop: Callable[[], bool],
                pictures: vision.ImagePrompt | None = None) -> None:
        """Decode the prompt (what the context already holds is reused), then sample the first token.

        ``pictures``: the prompt has images; it is decoded by a :class:`PicturedPrompt` instead, from an
        empty context, and the loop goes on from its positions."""
        if pictures is not None:
            reading = self.read_pictures(pictures, on_prefill, should_stop)
            while not reading.step():
                pass
            return
        t0 = time.perf_counter()
        held = self.request.hold_last_prompt_token and len(tokens) > 1
        prefill = tokens[:-1] if held else tokens
        reused, self.kept, cancelled, pending = _prefill(self.session, self.drafter, self.spec, prefill, self.batch,
                                                         on_prefill, should_stop)
        self.stats.prompt_reused = reused
        self.pos0 = len(prefill)
        self.first_token(time.perf_counter() - t0, cancelled, tokens[-1] if held else None)
        if pending is not None:  # the drafter's catch-up on the last chunk, once the first token is out
            pending()

    def read_pictures(self, pictures: vision.ImagePrompt, on_prefill: PrefillCallback | None,
                      should_stop: Callable[[], bool], *, shared: bool = False) -> PicturedPrompt:
        """The reading of a prompt with images, a piece at a time (``shared``: into this decoder's sequence
        alone, the others' cells stay: a multi-sequence engine; else the whole context is emptied)."""
        return PicturedPrompt(self, pictures, on_prefill, should_stop, self.seq if shared else None)

    def first_token(self, prefill_s: float, cancelled: bool, held: int | None = None) -> None:
        """The prompt is in: sample the reply's first token from its last row (``held``: the token the
        prompt held back is id_last instead)."""
        # the drafter's catch-up on the prompt is its own phase, not prefill
        self.stats.phase_seconds["prefill"] = prefill_s - self.drafter.seconds["catch_up"]
        self.stats.t_first_token = time.perf_counter()
        if cancelled:
            self.out.finish = "cancelled"
        elif held is not None:
            self.id_last = held
        else:
            row = self.batch.n - 1
            self.id_last = self.sampler.sample(self.target.handle, row)
            self.out.push(self.id_last, False, self.margin(row), self.logprob(row, self.id_last))

    def room(self) -> int:
        """Drafts that still fit after id_last, in the reply and the context (-1: the context is full)."""
        ctx_room = self.target.n_ctx - 1 - self.pos0 - self.cells_past_pos
        return ctx_room if ctx_room < 0 else min(self.request.max_tokens - len(self.out.tokens) - 1, ctx_room)

    def round(self, room: int) -> Round:
        """Draft, verify on the target, sample each row until a draft is rejected, roll the rest back."""
        rnd = self.propose(room)
        self.batch.clear()
        self.add_rows(rnd, self.batch)
        t_verify = time.perf_counter()
        self.target.decode(self.batch)
        self.sample(rnd, time.perf_counter() - t_verify)
        self.close_round(rnd)
        return rnd

    # A round in steps, so a multi-sequence engine (engine/generation/parallel.py) can verify
    # several sequences' rounds in one target decode: propose, add_rows, (decode), sample, close_round.
    def propose(self, room: int) -> Round:
        """The policy's depth and the drafter's draft for this round."""
        t_round = time.perf_counter()
        n = self.policy.choose(room)
        self.before_draft(n)
        draft_s = self.drafter.seconds["draft"]
        drafts = self.drafter.draft(self.id_last, self.pos0, n) if n > 0 else []
        return self.drafted(drafts, self.drafter.seconds["draft"] - draft_s, t_round)

    def before_draft(self, n: int) -> None:
        """The policy chose ``n`` drafts for this round: a shadow probe's head drafts from its own row."""
        if n and self.policy.shadow_probe and isinstance(self.drafter, MTPDrafter):
            self.drafter.probe_alone()

    def drafted(self, drafts: list[int], draft_s: float, t_round: float) -> Round:
        """The round of these drafts (a multi-sequence engine drafts several sequences' together)."""
        # q of each draft when they were sampled (an n-gram round of mtp+ngram has none: it matches)
        q_rows = self.draft_sampler.take() if self.draft_sampler is not None else []
        shadow: list[int] = []
        if drafts and self.policy.shadow_probe:
            shadow, drafts = drafts, []
        return Round(drafts, shadow, [], 0, [], [], draft_s, 0.0, started=t_round,
                     q_rows=q_rows if drafts and len(q_rows) == len(drafts) else [],
                     shadow_q=q_rows[0] if shadow and q_rows else None)

    def add_rows(self, rnd: Round, batch: Batch) -> None:
        """Put ``[id_last, drafts...]`` in the verify batch (from its row ``rnd.row0``)."""
        rnd.row0 = batch.n
        for k, tok in enumerate([self.id_last, *rnd.drafts]):
            batch.add(tok, self.pos0 + k, True, self.seq)
        with self.clock("rollback"):
            self.rollback.before_verify(len(rnd.drafts))

    def sample(self, rnd: Round, verify_s: float) -> None:
        """After the verify decode: sample each row in order until a draft is rejected (sampled drafts:
        judge each by rejection sampling). Reads the decode's rows only (nothing decodes on the
        target before every sequence has sampled)."""
        rnd.verify_s = verify_s
        self.stats.phase_seconds["verify"] += verify_s
        verified = [self.id_last, *rnd.drafts]
        self.drafter.verified(verified, self.pos0, rnd.row0)
        with self.clock("sampling"):
            if rnd.q_rows:
                self._judge_drafts(rnd)
                return
            if rnd.shadow_q is not None:  # p of the plain row, before its token enters the chain
                p = self.sampler.distribution(np.ctypeslib.as_array(self.target.logits(rnd.row0),
                                                                    shape=(self.model.n_vocab,)))
                d = rnd.shadow[0]
                rnd.shadow_hit = min(1.0, float(p[d] / rnd.shadow_q[d]))
            for k in range(len(verified)):
                row = rnd.row0 + k
                tok = self.sampler.sample(self.target.handle, row)
                rnd.tokens.append(tok)
                rnd.margins.append(self.margin(row))
                rnd.logprobs.append(self.logprob(row, tok))
                if not accepts_draft(k, tok, rnd.drafts, self.model.is_eog):
                    break
                rnd.accepted += 1

    def _judge_drafts(self, rnd: Round) -> None:
        """Rejection sampling of sampled drafts: draft k is kept with probability min(1, p/q) at its
        row, a rejected one is replaced by a draw from the residual max(0, p - q), and after every
        draft the next token is drawn from p. The target's p at each row comes from the request's
        whole chain without its final pick, computed after the tokens before that row were accepted
        into the chain, so penalties and grammar see the emitted tokens in order, as in plain
        sampling. An end-of-generation token ends the round as its own token (see accepts_draft)."""
        assert self.draft_sampler is not None
        rng, n_vocab = self.draft_sampler.rng, self.model.n_vocab
        for k in range(len(rnd.drafts) + 1):
            row = rnd.row0 + k
            p = self.sampler.distribution(np.ctypeslib.as_array(self.target.logits(row), shape=(n_vocab,)))
            kept, tok = judge(p, rnd.q_rows[k], rnd.drafts[k], rng) if k < len(rnd.drafts) else (False, draw(p, rng))
            self.sampler.accept(tok)
            rnd.tokens.append(tok)
            rnd.margins.append(self.margin(row))
            rnd.logprobs.append(self.logprob(row, tok))
            if not kept or (self.model.is_eog(tok) and k < len(rnd.drafts) - 1):
                break
            rnd.accepted += 1

    def close_round(self, rnd: Round) -> None:
        """Keep the accepted rows, roll the rejected ones back on both contexts."""
        verified = [self.id_last, *rnd.drafts]
        self.kept.extend(verified[:rnd.accepted + 1])
        if rnd.drafts:
            with self.clock("rollback"):
                self.rollback.after_verify(verified, self.pos0, rnd.accepted)
        self.drafter.accept(rnd.accepted, self.pos0)
        rnd.seconds = time.perf_counter() - rnd.started

    def learn(self, rnd: Round, share: float = 1.0) -> None:
        """Count the round and tell the policy what it measured; ``share``: this sequence's part of a
        decode it shared with others (a multi-sequence batch: its rows of the batch's)."""
        self.stats.record_round(len(rnd.drafts), rnd.accepted, self.drafter.source)
        if rnd.drafts:
            self.result.accepted_per_round.append(rnd.accepted)
            self.result.drafted_per_round.append(len(rnd.drafts))
            if self.request.record_drafts:
                self.result.drafts_per_round.append(tuple(rnd.drafts))
                if self.drafter.draft_margins:  # the MTP head's, one per draft token
                    self.result.draft_margins_per_round.append(tuple(self.drafter.draft_margins))
        if rnd.shadow:
            # a sampled draft would have been kept with probability min(1, p/q) (rejection sampling), not
            # only when the plain step happened to draw it: that chance, not a coin, is what acceptance is
            hit = rnd.shadow_hit if rnd.shadow_q is not None else float(
                accepts_draft(0, rnd.tokens[0], rnd.shadow[:1], self.model.is_eog))
            self.policy.observe(1, hit, share * rnd.verify_s, rnd.draft_s, share * rnd.seconds, shadow=True)
        else:
            self.policy.observe(len(rnd.drafts), rnd.accepted, share * rnd.verify_s, rnd.draft_s,
                                share * rnd.seconds)
        self.stats.draft_depth = self.policy.depth

    def emit(self, rnd: Round) -> None:
        """Show the round's tokens (an end of generation stops them) and move past them."""
        for k, tok in enumerate(rnd.tokens):
            self.out.push(tok, k < rnd.accepted, rnd.margins[k], rnd.logprobs[k])
            if self.out.finish is not None:
                break
        self.pos0 += rnd.accepted + 1
        self.id_last = rnd.tokens[-1]

    def tick(self, on_stats: StatsCallback | None) -> None:
        """Live statistics, every :data:`STATS_INTERVAL_S`."""
        now = time.perf_counter()
        self.stats.generated_tokens = len(self.out.tokens)
        if on_stats is not None and now - self.last_stats >= STATS_INTERVAL_S:
            self.last_stats = now
            self._book_drafter()
            on_stats(self.stats)

    def finish(self, prompt_mode: str, on_stats: StatsCallback | None, keep_prefix: bool = True) -> GenerateResult:
        """Keep what the contexts hold for the next prompt; close the text and the statistics.
        ``keep_prefix`` False: the prefix cache does not describe this sequence (a multi-sequence run)."""
        lane = mtp_half(self.drafter)
        if not self.pictured and lane is not None and lane.settles_at_end:
            # the catch-up the last rounds deferred (folded into a next draft that will not come, plain
            # steps', or MTP + n-gram's through its n-gram rounds): decoded now, as part of the reply whose
            # rows they are, so the head holds every row the target kept and the next prompt reuses all of
            # them. Left deferred, the MTP context ended short of the target, and the next turn read the
            # reply's tail again on both contexts.
            lane.settle()
        if self.pictured or not keep_prefix:
            self.session.prefix.forget()
        else:
            _keep(self.session, self.drafter, self.kept)
        out, stats = self.out, self.stats
        out.close()
        self._book_drafter()
        stats.generated_tokens = len(out.tokens)
        stats.t_end = time.perf_counter()
        accounted = sum(v for k, v in stats.phase_seconds.items() if k != "other")
        stats.phase_seconds["other"] = max(0.0, stats.elapsed() - accounted)
        if on_stats is not None:
            on_stats(stats)
        return replace(self.result, text="".join(out.text), tokens=out.tokens, finish_reason=out.finish or "stop",
                       prompt_mode=prompt_mode, margins=out.margins, logprobs=out.logprobs,
                       stop=out.stops.matched, reasoning="".join(out.reasoning))

    def _book_drafter(self) -> None:
        self.stats.phase_seconds["draft"] = self.drafter.seconds["draft"]
        self.stats.phase_seconds["catch_up"] = self.drafter.seconds["catch_up"]

    def margin(self, row: int) -> float | None:
        return top2_margin(self.target.logits(row), self.model.n_vocab) if self.request.record_margins else None

    def logprob(self, row: int, token: int) -> dict[str, Any] | None:
        if self.request.logprobs < 0 or self.model.is_eog(token):
            return None
        return token_logprobs(self.target.logits(row), self.model.n_vocab, token, self.request.logprobs,
                              self.model.piece)
