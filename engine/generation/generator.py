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

from collections.abc import Callable

from engine.errors import ContextError
from engine.generation import chat_template
from engine.generation import images as vision
from engine.generation.decoder import Decoder, ended_early, request_sampler
from engine.generation.output import Output
from engine.generation.prompt import max_prompt_chars, render_prompt, render_request
from engine.generation.request import (
    GenerateRequest,
    GenerateResult,
    PrefillCallback,
    ReasoningCallback,
    StatsCallback,
    TextCallback,
    TextLogprobsCallback,
)
from engine.generation.session import Session
from engine.speculative.depth import DepthPolicy
from engine.speculative.settings import MTP, SPECULATION_OFF
from engine.speculative.stats import GenerationStats

# the request types live in request.py, the prompt in prompt.py, a round in decoder.py; callers import
# the loop and what it takes from here
__all__ = ["GenerateRequest", "GenerateResult", "generate", "render_prompt"]


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
    policy: DepthPolicy | None = None,
) -> GenerateResult:
    """Run one generation to its end; see the module docstring for the steps.

    ``policy``: the draft depth policy to use instead of the session's (benchmarks compare policies).

    Raises:
        ContextError: the prompt does not fit the context, or a decode failed.
    """
    # the one place a request's settings meet the model's limits; plain decoding is a drafter too.
    # After an image only the MTP head drafts (it catches up on the image's rows; docs/vision.md)
    pictured = vision.has_images(request)
    plain = pictured and request.speculative.mode != MTP
    asked = SPECULATION_OFF if plain else request.speculative.for_sampling(request.sampling.greedy)
    spec, drafter, session_policy = session.speculation(asked)
    policy = policy or session_policy
    policy.new_reply(drafter.shadow_probes)
    stats = GenerationStats(settings=spec, rollback=session.rollback_strategy if spec.enabled else "none")
    try:
        if should_stop():  # cancelled while it waited: not even the prompt is worth reading
            raise chat_template.RenderCancelled()
        if pictured:  # rendered here, decoded by the prefill (its text tokens enter the sampler there)
            pictures = vision.render_request(session, request, should_stop, max_prompt_chars(session.target.n_ctx))
            tokens, prompt_mode, opens_thinking = [], pictures.mode, pictures.opens_thinking
        else:
            pictures = None
            tokens, prompt_mode, opens_thinking = render_request(session, request, should_stop)
    except chat_template.RenderCancelled:
        templated = request.messages is not None and bool(request.template or session.facts.chat_template)
        return ended_early(stats, "cancelled", chat_template.TEMPLATE if templated else chat_template.COMPLETION,
                            on_stats)
    tokens = tokens or ([] if pictured else [session.model.bos])
    if len(tokens) + 1 >= session.target.n_ctx:
        raise ContextError(f"The prompt has {len(tokens)} tokens; the context holds {session.target.n_ctx}. "
                           "Shorten the conversation or raise the context size.")
    stats.prompt_tokens = len(tokens)
    if request.max_tokens <= 0:  # nothing to generate: not even the first sampled token
        if pictures is not None:  # counted as the prefill would take it: its text tokens and image rows
            with session.projector.tokenize(pictures.text, pictures.images,
                                            add_special=pictures.add_special) as chunks:
                stats.prompt_tokens = chunks.n_tokens
        return ended_early(stats, "length", prompt_mode, on_stats)
    out = Output(session.model, request.stop, request.max_tokens, request.split_reasoning, on_text,
                 on_reasoning, opens_thinking, on_text_logprobs)
    sampler = request_sampler(session, request, tokens, opens_thinking)
    if request.guided_drafts:  # under a grammar: the drafter drafts what it allows
        drafter.guide = sampler.draft_guide()
    drafter.draft_margins = [] if request.record_drafts else None
    decoder = Decoder(session, request, spec, drafter, policy, sampler, out, stats)
    try:
        decoder.prefill(tokens, on_prefill, should_stop, pictures)
        while out.finish is None:
            if should_stop():
                out.finish = "cancelled"
            elif (room := decoder.room()) < 0:
                out.finish = "length"
            else:
                rnd = decoder.round(room)
                decoder.learn(rnd)
                decoder.emit(rnd)
                decoder.tick(on_stats)
    except BaseException:
        session.prefix.forget()  # a decode failed or was interrupted: what the context holds is unknown
        raise
    finally:
        # the session's drafter outlives this request
        drafter.guide = drafter.draft_margins = drafter.draft_sampler = drafter.penalties = None
        sampler.close()
    return decoder.finish(prompt_mode, on_stats)
