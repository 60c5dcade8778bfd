"""From a checked request to what the worker runs, and from what it ran to a :class:`Reply`.

Every API (OpenAI, Responses, Anthropic, Ollama) parses its body into the
same :class:`~engine.server.openai_format.ParsedRequest`; this module decides
the rest once for all of them:

- **Tools.** The model's chat template renders them, and the reply is parsed
  with the tool-call syntax of that template's family
  (``engine/generation/tool_calls.py``). A model without a template is given
  the generic ChatML template with Hermes-style calls (as llama-server falls
  back to a generic format); a template with no syntax we know is parsed as
  Hermes, the syntax most fine-tunes use. ``tool_choice`` "required" or a
  named function constrains the output with a grammar that allows exactly one
  well-formed call, so even a model that would not call a tool does; "auto"
  uses a lazy grammar, triggered by the call marker, where the family allows
  (a call the model begins is well formed); "none" renders no tools.
- **Structured output.** A JSON schema (``{}``: any object) or a GBNF grammar
  goes to the worker, which samples under it; speculation keeps the output
  identical (engine/runtime/sampler.py says why).
- **Images.** Every API's images (``openai_format.take_image``) reach the worker as base64 beside markers in
  the text; a model loaded without a vision projector refuses them (400).
- **Streaming with tools.** Text streams until the family's call marker
  appears; a tail that could begin the marker is held back, and the calls go
  out at the end, parsed from the whole reply.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from engine.errors import GrammarError, ImageError
from engine.generation import chat_template, grammars, tool_calls
from engine.generation.image_sources import read_image
from engine.sampling import MAX_SEED, RANDOM_SEED
from engine.server.openai_format import ParsedRequest, bad
from engine.server.reply import Reply, TokenLogprob
from engine.speculative.settings import SpeculativeSettings
from engine.worker import protocol as P

GENERIC_FAMILY = "hermes"  # the syntax of chat_template.GENERIC_TEMPLATE


@dataclass(frozen=True)
class Plan:
    """How to run one request: the worker message's fields, and how to read the reply."""

    fields: dict[str, Any]  # GenerateRequestMsg's keyword arguments, but its id
    family: str | None  # the tool-call syntax to parse the reply with; None: no tools offered
    speculative: SpeculativeSettings
    notes: tuple[str, ...] = ()  # said in the response's speculative report / logs
    tools: tuple[dict[str, Any], ...] = ()  # their schemas say which parameter values are text


def make(parsed: ParsedRequest, model: P.ModelInfo, default: SpeculativeSettings, *, choice: int = 0,
         template: str | None = None, image_files: bool = False) -> Plan:
    """The worker fields for ``parsed`` on ``model``; ``choice`` > 0 is the n-th of ``n`` (its seed moves on).
    ``template``: the server's chat template in place of the model's (``serve --chat-template``).
    ``image_files``: images may name local files (``serve --allow-local-images``)."""
    # what the request asks; the engine limits it to what the model drafts (Session.speculation) and
    # the statistics say what ran (openai_format.speculative_report)
    speculative = parsed.speculative or default
    sampling = parsed.sampling
    if choice and sampling.seed != RANDOM_SEED:
        sampling = replace(sampling, seed=(sampling.seed + choice) & MAX_SEED)
    fields: dict[str, Any] = dict(prompt=parsed.prompt, messages=parsed.messages, max_tokens=parsed.max_tokens,
                                  stop=parsed.stop, speculative=speculative, sampling=sampling,
                                  logit_bias={str(t): b for t, b in parsed.logit_bias.items()},
                                  logprobs=-1 if parsed.logprobs is None else parsed.logprobs,
                                  grammar=parsed.grammar,
                                  # a raw GBNF grammar holds the whole reply, as llama-server applies one
                                  grammar_after_thinking=parsed.grammar is None)
    if parsed.images:
        fields["images"] = _images(parsed.images, model, image_files)
    if parsed.json_schema is not None:
        try:
            fields["grammar"] = grammars.from_json_schema(parsed.json_schema)
        except GrammarError as exc:
            raise bad("response_format", str(exc)) from None
    family = None
    notes: tuple[str, ...] = ()
    if parsed.messages is not None:  # a chat: the template's variables, its thinking block apart
        fields["template_kwargs"] = parsed.template_kwargs
        fields["split_reasoning"] = parsed.split_reasoning
        if template is not None:
            fields["template"] = template
    if parsed.tools and parsed.tool_choice != "none":
        family = (tool_calls.family_of(template) if template is not None else model.tool_syntax) or GENERIC_FAMILY
        fields["tools"] = parsed.tools
        if template is None and not model.has_chat_template:
            fields["template"] = chat_template.GENERIC_TEMPLATE
            notes = ("This model has no chat template; the generic ChatML template with Hermes-style tool calls "
                     "was used.",)
        if parsed.tool_choice == "required" or isinstance(parsed.tool_choice, dict):
            name = parsed.tool_choice["function"]["name"] if isinstance(parsed.tool_choice, dict) else None
            if fields["grammar"] is not None:
                raise bad("tool_choice", "a required tool call cannot be combined with a grammar or a JSON format")
            fields["grammar"] = tool_calls.forced_call_grammar(family, parsed.tools, name)
        elif fields["grammar"] is None and (lazy := tool_calls.auto_call_grammar(family, parsed.tools)):
            fields["grammar"], fields["grammar_triggers"] = lazy  # a call the model begins is well formed
    return Plan(fields=fields, family=family, speculative=speculative, notes=notes, tools=tuple(parsed.tools or ()))


def _images(sources: list[str], model: P.ModelInfo, image_files: bool) -> list[str]:
    """The request's images as the worker takes them (base64), each read from its source."""
    if not model.vision:
        raise bad("messages", f"The loaded model ({Path(model.path).name}) takes no images: it was loaded without a "
                  "vision projector. Load it with its mmproj-*.gguf (`mtp-studio serve --mmproj FILE`) to send "
                  "images.", "model_not_vision")
    out = []
    for i, source in enumerate(sources):
        try:
            data = read_image(source, allow_files=image_files)
        except ImageError as exc:
            hint = "" if image_files or source.startswith("data:") else \
                " (a server started with --allow-local-images reads local files)"
            raise bad("messages", f"image {i + 1}: {exc}{hint}") from None
        out.append(base64.b64encode(data).decode("ascii"))
    return out


def logprobs_of(done: list[P.TokenLogprobs] | None) -> tuple[TokenLogprob, ...] | None:
    if done is None:
        return None
    return tuple(TokenLogprob(token=e.token, logprob=e.logprob, bytes=e.bytes,
                              top=[(t.token, t.logprob, t.bytes) for t in e.top]) for e in done)


def reply(plan: Plan, model_id: str, text: str, finish: str, *, prompt_tokens: int, completion_tokens: int,
          cached_tokens: int, logprobs: list[P.TokenLogprobs] | None = None, stop: str | None = None,
          reasoning: str = "", extras: dict[str, Any] | None = None) -> Reply:
    """The API-neutral answer: the text split into content and tool calls when tools were offered."""
    content, calls = text, ()
    if plan.family is not None:
        content, found = tool_calls.parse(plan.family, text, list(plan.tools))
        if not found and not content.strip() and reasoning:
            # a call written inside a thinking block the prompt opened and the reply never closed (a
            # forced call on Qwen3.5 or GLM 4.7, whose generation prompt ends with <think>): it is the call
            reasoning, found = tool_calls.parse(plan.family, reasoning, list(plan.tools))
        calls = tuple(found)
    if calls and finish == "stop":
        finish = "tool_calls"
    return Reply(model=model_id, content=content, tool_calls=calls, finish=finish, prompt_tokens=prompt_tokens,
                 completion_tokens=completion_tokens, cached_tokens=cached_tokens, logprobs=logprobs_of(logprobs),
                 stop_sequence=stop, reasoning=reasoning.strip(), extras=extras or {})


class TextFilter:
    """What of a streamed reply may be shown as content as it arrives.

    Without tools, everything. With tools, text up to the family's call marker; a tail that
    could be the start of the marker waits for the next piece, and nothing after the marker
    is shown (the calls are sent at the end, parsed from the whole text).
    """

    def __init__(self, family: str | None) -> None:
        self.marker = tool_calls.start_marker(family) if family is not None else ""
        self.text = ""  # everything received
        self.shown = 0  # characters of it sent as content
        self.in_call = False

    def feed(self, delta: str) -> str:
        self.text += delta
        if not self.marker:
            shown, self.shown = self.text[self.shown:], len(self.text)
            return shown
        if self.in_call:
            return ""
        at = self.text.find(self.marker, self.shown)
        if at >= 0:
            self.in_call = True
            end = at
        else:
            end = len(self.text) - tool_calls.held_back(self.text, self.marker)
        shown, self.shown = self.text[self.shown:end], max(self.shown, end)
        return shown

    def rest(self, final: Reply) -> str:
        """Content not yet shown, once the reply is parsed (it may have trimmed what was held back)."""
        sent = self.text[:self.shown]
        if final.content.startswith(sent):
            return final.content[len(sent):]
        return ""
