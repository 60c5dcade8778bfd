"""What a generation is asked (:class:`GenerateRequest`), what it gives back
(:class:`GenerateResult`), and the callbacks it reports through as it goes.

One request type for every caller: the worker, the CLI, the benchmarks, the
autotune and the multi-sequence engine build it; ``engine/generation/generator.py``
and ``engine/generation/parallel.py`` run it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine.generation import chat_template
from engine.runtime import SamplingParams
from engine.speculative.mtp_images import EXACT
from engine.speculative.settings import SPECULATION_OFF, SpeculativeSettings
from engine.speculative.stats import GenerationStats


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
    # greedy decoding was to choosing another token (engine/generation/identity.py).
    record_margins: bool = False
    # encoded images (PNG, JPEG, …), one per image marker in the prompt or the messages' text, after any
    # image parts of the messages (engine/generation/images.py); they need the session's projector
    images: tuple[bytes, ...] = ()
    # how the MTP context gets an image's rows (engine/speculative/mtp_images.py; benches compare them)
    image_rows: str = EXACT


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
