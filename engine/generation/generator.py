"""The decode loop, plain and speculative, in one place.

Plain decoding is the case where the draft is always empty. Each step:

1. draft: ask the drafter for up to ``n_max`` tokens after ``id_last``;
2. verify: decode ``[id_last, drafts...]`` on the target in one batch, then
   let the drafter catch up on that batch;
3. accept: sample the target at each row with the request's sampler and keep
   drafts while they equal the sample (this keeps the target's distribution
   exactly; with greedy sampling the output is the plain greedy output);
4. roll back the rejected rows on both contexts;
5. stream the accepted text, checking end-of-generation, stop strings and
   the token limit token by token.

Cancellation is checked between decodes, and while a chat template renders.

The sampler chain is stateful (its penalties remember what it accepted), and
``Sampler.sample`` accepts the token it returns. The loop therefore samples
verify rows in order and stops at the first rejected draft: the chain's
history is exactly the prompt (``accept_prompt``, as llama.cpp does) followed
by the emitted tokens, the same as in plain decoding, so with any sampler —
penalties and seeded randomness included — speculation keeps the target's
distribution. The random generator draws once per sample, so a seeded reply
draws the same numbers with and without MTP.

Prefill reports its progress (``on_prefill(done, total)``: before the first
chunk and after each), so a long prompt is not minutes of silence.

Acceptance follows llama.cpp's ``common_sampler_sample_and_accept_n``: a
draft that equals an end-of-generation sample is accepted only when it is the
last draft of the round (earlier, the drafts after it would enter the context
but never the output), so drafted/accepted counts match its driver's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine.errors import ContextError
from engine.generation import chat_template
from engine.generation.detokenizer import Detokenizer
from engine.generation.reasoning import ReasoningSplit
from engine.generation.session import Session
from engine.generation.stops import StopMatcher
from engine.runtime import Batch, Sampler, SamplingParams
from engine.speculative.drafter import Drafter
from engine.speculative.mtp import MTPDrafter
from engine.speculative.rollback import TargetRollback
from engine.speculative.settings import MAX_DRAFT, SPECULATION_OFF, SpeculativeSettings
from engine.speculative.stats import GenerationStats

STATS_INTERVAL_S = 0.25
# A request's grammar behind a thinking block the prompt opened: the rule the sampler starts from
AFTER_THINKING_ROOT = "mtp-studio-after-thinking"
AFTER_THINKING = f'\n{AFTER_THINKING_ROOT} ::= "</think>" [\\n]{{0,2}} root\n'
# A prompt longer than this many characters per context token cannot fit (real
# tokenizers average 2-5 characters a token); refusing it before tokenizing
# spares a 100 MB prompt a minute of uncancellable tokenization.
MAX_CHARS_PER_TOKEN = 16


@dataclass(frozen=True)
class GenerateRequest:
    prompt: str | None = None
    messages: tuple[dict[str, Any], ...] | None = None
    # tools the chat template renders (OpenAI's shape); messages may then hold tool calls and results
    tools: tuple[dict[str, Any], ...] | None = None
    # GBNF the output follows (engine/generation/grammars.py turns a JSON schema into one)
    grammar: str | None = None
    grammar_triggers: tuple[str, ...] = ()  # regular expressions that start a lazy grammar
    # the grammar holds the answer, not a thinking block the prompt opened (a JSON schema, a forced tool
    # call); False: it holds the whole reply (a raw GBNF grammar, as llama-server applies one)
    grammar_after_thinking: bool = True
    logit_bias: tuple[tuple[int, float], ...] = ()
    # -1: none; k >= 0: each generated token's log-probability and its k likeliest alternatives
    logprobs: int = -1
    template: str | None = None  # a chat template in place of the model's
    template_kwargs: dict[str, Any] | None = None  # more template variables (enable_thinking, …)
    continue_final_message: bool = False  # the last message is an unfinished reply to go on from (Continue)
    # hand the text of a <think> block to on_reasoning instead of on_text (engine/generation/reasoning.py)
    split_reasoning: bool = False
    # under a grammar, the MTP head drafts only what the grammar allows (off: it drafts freely and
    # the target rejects what breaks the grammar; tests and benchmarks compare the two)
    guided_drafts: bool = True
    sampling: SamplingParams = SamplingParams()
    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    speculative: SpeculativeSettings = SPECULATION_OFF
    # Prefill all but the last prompt token and start the loop from it, as
    # llama.cpp's speculative-simple does; the benchmark uses this to compare
    # drafted/accepted counts round by round with the C++ driver.
    hold_last_prompt_token: bool = False
    # Keep each round's draft tokens (tests compare drafts, not only counts).
    record_drafts: bool = False
    # Keep the target's top-2 logit margin at every sampled token: how close
    # greedy decoding was to choosing another token (engine/speculative/identity.py).
    record_margins: bool = False


@dataclass
class GenerateResult:
    text: str
    tokens: list[int]
    finish_reason: str  # stop | length | cancelled
    stats: GenerationStats
    prompt_mode: str = chat_template.COMPLETION
    accepted_per_round: list[int] = field(default_factory=list)
    drafted_per_round: list[int] = field(default_factory=list)
    # with record_drafts: the draft of every round, in order, and (MTP) each draft token's top-2 logit margin
    drafts_per_round: list[tuple[int, ...]] = field(default_factory=list)
    draft_margins_per_round: list[tuple[float, ...]] = field(default_factory=list)
    # with record_margins: one per token of ``tokens``, plus one for the
    # end-of-generation token when that ended the reply
    margins: list[float] = field(default_factory=list)
    stop: str | None = None  # the request's stop string that ended it, when one did
    reasoning: str = ""  # with split_reasoning: the <think> block's text (``text`` is the answer)
    # with logprobs >= 0: one per token of ``tokens`` (see token_logprobs)
    logprobs: list[dict[str, Any]] = field(default_factory=list)


# on_text(text, from_draft): text that became visible, and whether it came
# from accepted draft tokens
TextCallback = Callable[[str, bool], None]
StatsCallback = Callable[[GenerationStats], None]
# on_text_logprobs(text, from_draft, logprobs): as on_text, with the logprobs of the tokens behind the text
# (with logprobs >= 0; a stream sends each piece's own)
TextLogprobsCallback = Callable[[str, bool, list[dict[str, Any]]], None]
# on_reasoning(text): text of the reply's thinking block (with split_reasoning)
ReasoningCallback = Callable[[str], None]
# on_prefill(done, total): prompt tokens decoded so far, of how many
PrefillCallback = Callable[[int, int], None]


def max_prompt_chars(n_ctx: int) -> int:
    """The longest prompt text (characters) worth tokenizing for a context of ``n_ctx`` tokens."""
    return MAX_CHARS_PER_TOKEN * n_ctx


def check_prompt_chars(n_chars: int, n_ctx: int) -> None:
    """Refuse text that cannot fit the context however it tokenizes, before tokenizing it."""
    if n_chars > max_prompt_chars(n_ctx):
        raise ContextError(
            f"The prompt has {n_chars:,} characters; a context of {n_ctx} tokens holds at most "
            f"{max_prompt_chars(n_ctx):,} ({MAX_CHARS_PER_TOKEN} per token). "
            "Shorten the conversation or raise the context size."
        )


def render_prompt(session: Session, request: GenerateRequest,
                  should_stop: Callable[[], bool] = lambda: False) -> tuple[list[int], str]:
    """Tokens of the request's prompt, and the mode (template or completion).

    Raises:
        ContextError: the text is far too long for the context.
        TemplateError: the chat template failed or passed its limits.
        chat_template.RenderCancelled: ``should_stop`` said so while rendering.
    """
    tokens, mode, _ = _render(session, request, should_stop)
    return tokens, mode


def _render(session: Session, request: GenerateRequest,
            should_stop: Callable[[], bool]) -> tuple[list[int], str, bool]:
    """As :func:`render_prompt`, and whether the prompt ends inside a thinking block it opened."""
    model = session.model
    n_ctx = session.target.n_ctx
    if request.messages is not None:
        check_prompt_chars(sum(len(m.get("content") or "") for m in request.messages), n_ctx)
        bos = model.token_text(model.bos) if model.add_bos else ""
        rendered = chat_template.render(
            list(request.messages), request.template or session.facts.chat_template,
            bos_token=bos, eos_token=model.token_text(model.eos),
            max_chars=max(max_prompt_chars(n_ctx), chat_template.MAX_CHARS), should_stop=should_stop,
            tools=list(request.tools) if request.tools else None, extra=request.template_kwargs,
            continue_final_message=request.continue_final_message,
        )
        check_prompt_chars(len(rendered.text), n_ctx)
        tokens = model.tokenize(rendered.text, add_special=not rendered.has_bos, parse_special=True)
        return tokens, rendered.mode, rendered.opens_thinking
    check_prompt_chars(len(request.prompt or ""), n_ctx)
    prompt = model.tokenize(request.prompt or "", add_special=True, parse_special=True)
    return prompt, chat_template.COMPLETION, False


class _Output:
    """Turns accepted tokens into visible text; decides when generation ends."""

    def __init__(self, session: Session, request: GenerateRequest, on_text: TextCallback | None,
                 on_reasoning: ReasoningCallback | None = None, opens_thinking: bool = False,
                 on_text_logprobs: TextLogprobsCallback | None = None) -> None:
        self.model = session.model
        self.on_text_logprobs = on_text_logprobs
        self.split = ReasoningSplit(opens_thinking) if request.split_reasoning else None
        self.on_reasoning = on_reasoning
        self.reasoning: list[str] = []
        # the logprobs of tokens pushed since the last answer text went out (a stream sends them with it)
        self.unsent_logprobs: list[dict[str, Any]] = []
        self.detok = Detokenizer(self.model.piece)
        self.stops = StopMatcher(request.stop)
        self.max_tokens = request.max_tokens
        self.on_text = on_text
        self.tokens: list[int] = []
        self.text: list[str] = []
        self.finish: str | None = None
        self.margins: list[float] = []
        self.logprobs: list[dict[str, Any]] = []

    def push(self, token: int, from_draft: bool, margin: float | None = None,
             logprob: dict[str, Any] | None = None) -> None:
        if margin is not None:
            self.margins.append(margin)
        if self.model.is_eog(token):
            self.finish = "stop"
            return
        self.tokens.append(token)
        if logprob is not None:
            self.logprobs.append(logprob)
            self.unsent_logprobs.append(logprob)
        self._show(self.stops.feed(self.detok.push(token)), from_draft)
        if self.stops.matched is not None:
            self.finish = "stop"
        elif len(self.tokens) >= self.max_tokens:
            self.finish = "length"

    def _show(self, shown: str, from_draft: bool, last: bool = False) -> None:
        pieces = [(shown, False)] if self.split is None else self.split.feed(shown)
        if last and self.split is not None:
            pieces += self.split.flush()
        for text, reasoning in pieces:
            if not text:
                continue
            if reasoning:
                self.reasoning.append(text)
                if self.on_reasoning:
                    self.on_reasoning(text)
            else:
                self.text.append(text)
                if self.on_text_logprobs:
                    self.on_text_logprobs(text, from_draft, self.unsent_logprobs)
                elif self.on_text:
                    self.on_text(text, from_draft)
                self.unsent_logprobs = []

    def close(self) -> None:
        self._show(self.stops.feed(self.detok.flush()) + self.stops.flush(), False, last=True)


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


def _ended_early(stats: GenerationStats, finish_reason: str, prompt_mode: str,
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


def _prefill(session: Session, drafter: Drafter | None, spec: SpeculativeSettings, prefill: list[int],
             batch: Batch, on_prefill: PrefillCallback | None,
             should_stop: Callable[[], bool]) -> tuple[int, list[int], bool]:
    """Decode the prompt on the target, in chunks of n_batch, keeping what the last generation left.

    Returns the prompt tokens reused, the tokens the target context now holds (position by
    position), and whether it was cancelled. The drafter catches up on each chunk. What is
    reused (engine/generation/prefix_cache.py): the MTP head needs h_target at each position
    it catches up on, so its context keeps one row more than the target and resumes after it.
    """
    target = session.target
    mtp_drafter = drafter if isinstance(drafter, MTPDrafter) else None
    reusing = True
    if mtp_drafter is not None:
        reused = session.prefix.start(target, prefill, session.is_hybrid,
                                      limit=session.prefix.mtp_limit(mtp_drafter.ctx, prefill))
    elif drafter is None or not spec.uses_mtp:
        reused = session.prefix.start(target, prefill, session.is_hybrid)
    else:  # MTP + n-gram: both contexts start empty
        session.prefix.forget()
        target.clear()
        reused, reusing = 0, False
    # a hybrid keeps its recurrent state from just before the prompt's last token, so a
    # regenerated reply (or a resent one that tokenizes otherwise) restarts there
    checkpoint_at = len(prefill) - 1 if reusing and session.is_hybrid and len(prefill) - 1 > reused else -1
    kept = list(prefill[:reused])
    if mtp_drafter is not None:
        mtp_drafter.begin(spec, keep=reused + 1 if reused else 0)
    elif drafter is not None:
        drafter.begin(spec)
        if reused:
            drafter.process(kept, 0)  # the n-gram drafter reads tokens only
    if on_prefill is not None:
        on_prefill(0, len(prefill) - reused)
    for start, end in _chunks(reused, len(prefill), target.n_batch, checkpoint_at):
        chunk = prefill[start:end]
        batch.clear()
        for k, tok in enumerate(chunk):
            batch.add(tok, start + k, start + k == len(prefill) - 1)
        target.decode(batch)
        kept.extend(chunk)
        if end == checkpoint_at:
            session.prefix.save_checkpoint(target, end)
        if mtp_drafter is not None and reused and start == reused:
            mtp_drafter.resume(chunk, start)  # its row at ``reused`` is kept: catch up from the next
        elif drafter is not None:
            drafter.process(chunk, start)
        if on_prefill is not None:
            on_prefill(end - reused, len(prefill) - reused)
        if should_stop():
            return reused, kept, True
    return reused, kept, False


def generate(
    session: Session,
    request: GenerateRequest,
    *,
    on_text: TextCallback | None = None,
    on_stats: StatsCallback | None = None,
    should_stop: Callable[[], bool] = lambda: False,
    on_prefill: PrefillCallback | None = None,
    on_reasoning: ReasoningCallback | None = None,
    on_text_logprobs: TextLogprobsCallback | None = None,
) -> GenerateResult:
    """Run one generation to its end; see the module docstring for the steps.

    Raises:
        ContextError: the prompt does not fit the context, or a decode failed.
    """
    stats = GenerationStats()
    # the one place a request's settings meet the model's limit
    spec = request.speculative.limited_to(session.max_draft)
    drafter = session.drafter_for(spec)  # MTP, n-gram or both (engine/speculative/compose.py)
    session.prepare(mtp=drafter is not None and spec.uses_mtp, drafts=drafter is not None)
    target = session.target
    stats.mode = f"{spec.mode}(n_max={spec.n_max})" if drafter else "off"
    # adaptive depth: each round's draft length from measured acceptance and costs
    policy = session.depth_policy(spec) if drafter is not None and spec.adaptive else None
    if policy is not None:
        stats.mode = f"{spec.mode}(adaptive, n_max={spec.n_max})"
        # its probes draft without verifying where the drafter allows it (the MTP head alone)
        policy.shadow = getattr(drafter, "shadow_probes", False)
        policy.new_reply()
    stats.rollback = session.rollback_strategy if drafter else "none"
    rollback = TargetRollback(target, session.rollback_strategy if drafter else "kv")
    n_vocab = session.model.n_vocab

    def margin(row: int) -> float | None:
        return top2_margin(target.logits(row), n_vocab) if request.record_margins else None

    def logprob(row: int, token: int) -> dict[str, Any] | None:
        if request.logprobs < 0 or session.model.is_eog(token):
            return None
        return token_logprobs(target.logits(row), n_vocab, token, request.logprobs, session.model.piece)

    def book_drafter() -> None:
        if drafter is not None:
            stats.phase_seconds["draft"] = drafter.seconds["draft"]
            stats.phase_seconds["catch_up"] = drafter.seconds["catch_up"]

    try:
        if should_stop():  # cancelled while it waited: not even the prompt is worth reading
            raise chat_template.RenderCancelled()
        tokens, prompt_mode, opens_thinking = _render(session, request, should_stop)
    except chat_template.RenderCancelled:
        templated = request.messages is not None and bool(request.template or session.facts.chat_template)
        return _ended_early(stats, "cancelled", chat_template.TEMPLATE if templated else chat_template.COMPLETION,
                            on_stats)
    if not tokens:
        tokens = [session.model.bos]
    if len(tokens) + 1 >= target.n_ctx:
        raise ContextError(
            f"The prompt has {len(tokens)} tokens; the context holds {target.n_ctx}. "
            "Shorten the conversation or raise the context size."
        )
    stats.prompt_tokens = len(tokens)
    if request.max_tokens <= 0:  # nothing to generate: not even the first sampled token
        return _ended_early(stats, "length", prompt_mode, on_stats)
    out = _Output(session, request, on_text, on_reasoning, opens_thinking, on_text_logprobs)
    grammar, triggers, root = request.grammar, request.grammar_triggers, "root"
    if grammar is not None and not triggers and opens_thinking and request.grammar_after_thinking:
        # the prompt opened a thinking block: the model thinks freely, and the grammar (a JSON schema, a
        # forced tool call) holds the answer from its closing tag on (a lazy grammar triggered there)
        grammar, triggers, root = grammar + AFTER_THINKING, (chat_template.THINK_CLOSE,), AFTER_THINKING_ROOT
    sampler = Sampler(request.sampling, session.model.n_vocab, target.n_ctx, vocab=session.model.vocab,
                      grammar=grammar, grammar_triggers=triggers, grammar_root=root,
                      logit_bias=dict(request.logit_bias))
    sampler.accept_prompt(tokens)
    batch = Batch(max(target.n_batch, MAX_DRAFT + 1))
    if isinstance(drafter, MTPDrafter) and request.guided_drafts:  # under a grammar: drafts it allows
        drafter.guide = sampler.draft_guide()
    if isinstance(drafter, MTPDrafter) and request.record_drafts:
        drafter.draft_margins = []
    accepted_per_round: list[int] = []
    drafted_per_round: list[int] = []
    drafts_per_round: list[tuple[int, ...]] = []
    draft_margins_per_round: list[tuple[float, ...]] = []
    last_stats = time.perf_counter()
    try:
        # -- prefill, in chunks of n_batch; the drafter catches up on each chunk
        t0 = time.perf_counter()
        held = request.hold_last_prompt_token and len(tokens) > 1
        prefill = tokens[:-1] if held else tokens
        reused, kept, cancelled = _prefill(session, drafter, spec, prefill, batch, on_prefill, should_stop)
        stats.prompt_reused = reused
        if cancelled:
            out.finish = "cancelled"
        # the drafter's catch-up on the prompt is its own phase, not prefill
        prefill_catch_up = drafter.seconds["catch_up"] if drafter is not None else 0.0
        stats.phase_seconds["prefill"] = time.perf_counter() - t0 - prefill_catch_up
        pos0 = len(prefill)
        stats.t_first_token = time.perf_counter()
        if held:
            id_last = tokens[-1]
        elif out.finish is None:
            id_last = sampler.sample(target.handle, batch.n - 1)
            out.push(id_last, False, margin(batch.n - 1), logprob(batch.n - 1, id_last))

        # -- decode loop ------------------------------------------------------
        while out.finish is None:
            if should_stop():
                out.finish = "cancelled"
                break
            ctx_room = target.n_ctx - 1 - pos0  # drafts that still fit after id_last
            if ctx_room < 0:
                out.finish = "length"
                break
            room = min(request.max_tokens - len(out.tokens) - 1, ctx_room)
            drafts: list[int] = []
            shadow: list[int] = []  # a shadow probe's draft: compared with the plain step's token, not verified
            t_round, drafted_s = time.perf_counter(), 0.0
            if policy is not None:
                room = policy.choose(room)
            if drafter is not None and room > 0:
                drafted_s = drafter.seconds["draft"]
                drafts = drafter.draft(id_last, pos0, room)
                drafted_s = drafter.seconds["draft"] - drafted_s
                if policy is not None and policy.probing and policy.shadow:
                    shadow, drafts = drafts, []

            verified = [id_last, *drafts]
            batch.clear()
            for k, tok in enumerate(verified):
                batch.add(tok, pos0 + k, True)
            t_rollback = time.perf_counter()
            rollback.before_verify(len(drafts))
            t_verify = time.perf_counter()
            stats.phase_seconds["rollback"] += t_verify - t_rollback
            target.decode(batch)
            verify_s = time.perf_counter() - t_verify
            stats.phase_seconds["verify"] += verify_s
            if drafter is not None:
                drafter.verified(verified, pos0)

            t_sample = time.perf_counter()
            accepted = 0
            new_tokens: list[int] = []
            margins: list[float | None] = []
            logprobs: list[dict[str, Any] | None] = []
            for k in range(len(verified)):
                tok = sampler.sample(target.handle, k)
                new_tokens.append(tok)
                margins.append(margin(k))
                logprobs.append(logprob(k, tok))
                if accepts_draft(k, tok, drafts, session.model.is_eog):
                    accepted += 1
                    continue
                break
            stats.phase_seconds["sampling"] += time.perf_counter() - t_sample

            kept.extend(verified[:accepted + 1])
            if drafts:
                t_rollback = time.perf_counter()
                rollback.after_verify(verified, pos0, accepted)
                stats.phase_seconds["rollback"] += time.perf_counter() - t_rollback
                accepted_per_round.append(accepted)
                drafted_per_round.append(len(drafts))
                if request.record_drafts:
                    drafts_per_round.append(tuple(drafts))
                    if isinstance(drafter, MTPDrafter) and drafter.draft_margins is not None:
                        draft_margins_per_round.append(tuple(drafter.draft_margins))
            if drafter is not None:
                drafter.accept(accepted, pos0)
            stats.record_round(len(drafts), accepted, drafter.source if drafter is not None else "mtp")
            if policy is not None:
                if shadow:
                    hit = int(accepts_draft(0, new_tokens[0], shadow[:1], session.model.is_eog))
                    policy.observe(1, hit, verify_s, drafted_s, time.perf_counter() - t_round, shadow=True)
                else:
                    policy.observe(len(drafts), accepted, verify_s, drafted_s, time.perf_counter() - t_round)
                stats.draft_depth = policy.depth
            elif drafter is not None:
                stats.draft_depth = len(drafts)

            for k, tok in enumerate(new_tokens):
                out.push(tok, k < accepted, margins[k], logprobs[k])
                if out.finish is not None:
                    break
            pos0 += accepted + 1
            id_last = new_tokens[-1]

            now = time.perf_counter()
            stats.generated_tokens = len(out.tokens)
            if on_stats is not None and now - last_stats >= STATS_INTERVAL_S:
                last_stats = now
                book_drafter()
                on_stats(stats)
    except BaseException:
        session.prefix.forget()  # a decode failed or was interrupted: what the context holds is unknown
        raise
    finally:
        if isinstance(drafter, MTPDrafter):
            drafter.guide = None  # the session's drafter outlives this request; the guide reads its sampler
            drafter.draft_margins = None
        sampler.close()
    session.prefix.keep(target, kept)
    if isinstance(drafter, MTPDrafter):
        session.prefix.keep_mtp(drafter.ctx, kept[:drafter.exact_end])
    out.close()
    book_drafter()
    stats.generated_tokens = len(out.tokens)
    stats.t_end = time.perf_counter()
    accounted = sum(v for k, v in stats.phase_seconds.items() if k != "other")
    stats.phase_seconds["other"] = max(0.0, stats.elapsed() - accounted)
    if on_stats is not None:
        on_stats(stats)
    return GenerateResult(
        text="".join(out.text),
        tokens=out.tokens,
        finish_reason=out.finish or "stop",
        stats=stats,
        prompt_mode=prompt_mode,
        accepted_per_round=accepted_per_round,
        drafted_per_round=drafted_per_round,
        drafts_per_round=drafts_per_round,
        draft_margins_per_round=draft_margins_per_round,
        margins=out.margins,
        logprobs=out.logprobs,
        stop=out.stops.matched,
        reasoning="".join(out.reasoning),
    )
