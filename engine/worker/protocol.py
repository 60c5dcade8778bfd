"""The worker protocol: one JSON object per line, versioned, every field checked.

Requests (app -> worker, here) and events (worker -> app,
``engine/worker/events.py``) are frozen dataclasses. ``decode_request`` and
``decode_event`` refuse anything malformed with a :class:`ProtocolError`
naming the field; nothing is guessed at.

Version 6 (what each version added: at PROTOCOL_VERSION):
  requests  load, generate, tokenize, cancel, unload, shutdown
  events    ready (the handshake), loaded, prefill (prompt progress), token,
            stats, done, tokens (answers tokenize), error, ack (ends a cancel), unloaded, bye
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any

from engine.errors import ProtocolError
from engine.load_options import LoadOptions
from engine.sampling import GREEDY, SamplingParams
from engine.speculative.settings import SPECULATION_OFF, SpeculativeSettings
from engine.unicode_text import first_bad_text
from engine.worker.events import (  # noqa: F401  (re-exported: the protocol is requests and events)
    EVENTS,
    AckEvent,
    ByeEvent,
    DoneEvent,
    EngineBuild,
    ErrorEvent,
    Event,
    LoadedEvent,
    ModelInfo,
    PrefillEvent,
    ReadyEvent,
    StatsEvent,
    TokenEvent,
    TokenLogprobs,
    TokensEvent,
    TopLogprob,
    UnloadedEvent,
    decode_event,
    is_final,
)
from engine.worker.fields import build

# 2: typed events, "off" for no speculation, max_draft in the handshake
# 3: load takes n_threads_draft; speculative settings take depth (fixed | adaptive); stats carry draft_depth;
#    load takes rpc / tensor_split / main_device and the loaded model says its placement (multi-machine);
#    speculative modes "ngram" and "mtp+ngram" (ngram_min / ngram_max); stats carry per-source draft counts
# 4: generate takes tools, tool-call messages, a grammar, logit_bias and logprobs; done carries
#    logprobs; the loaded model says its tool-call syntax; tokenize requests and tokens events
# 5: generate carries its sampling whole ("sampling": {temperature, top_k, ...}) instead of nine flat fields;
#    generate takes continue_final_message (Continue: the last message is the reply to go on from);
#    load carries its options whole ("options": {path, n_ctx, n_threads, ...})
#    stats carry the speculative settings that ran ("settings") instead of a "mode" label
# 6: generate takes images (base64, one per IMAGE_MARKER in the prompt or the messages' text); load options
#    take mmproj (a vision projector) and the loaded model says whether it takes images ("vision")
# 7: speculative settings take draft_sampling (match | probabilistic: sampled drafts kept by rejection sampling)
# 8: stats carry the sequence that decoded the reply ("sequence")
PROTOCOL_VERSION = 8
# where an image goes in a generate request's text: mtmd's default marker (the projector's own)
IMAGE_MARKER = "<__media__>"
HANDSHAKE_TIMEOUT_S = 60.0  # the first import of llama_cpp can be slow on a cold disk


# -- requests --------------------------------------------------------------
MAX_TOP_LOGPROBS = 20  # as OpenAI
_MESSAGE_KEYS = {"role", "content", "tool_calls", "tool_call_id", "name"}


def check_messages(messages: list[dict[str, Any]] | None) -> None:
    """A chat message is ``{"role": str, "content": str | null}``, plus an assistant's
    ``tool_calls`` (``[{"id", "type": "function", "function": {"name", "arguments": JSON text}}]``)
    and a tool result's ``tool_call_id`` and ``name``; anything else is refused here, so a
    template never sees a shape nobody checked.

    Raises:
        ValueError: naming the message and the field.
    """
    for i, message in enumerate(messages or ()):
        where = f"messages[{i}]"
        if not isinstance(message, dict) or not set(message) <= _MESSAGE_KEYS:
            raise ValueError(f"{where} must be an object with keys among {sorted(_MESSAGE_KEYS)}")
        if not isinstance(message.get("role"), str):
            raise ValueError(f"{where}.role must be a string")
        if not isinstance(message.get("content", ""), str | None):
            raise ValueError(f"{where}.content must be a string")
        for key in ("tool_call_id", "name"):
            if not isinstance(message.get(key, ""), str):
                raise ValueError(f"{where}.{key} must be a string")
        for k, call in enumerate(message.get("tool_calls") or ()):
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict) or not isinstance(function.get("name"), str) \
                    or not isinstance(function.get("arguments"), str) or not isinstance(call.get("id", ""), str):
                raise ValueError(f"{where}.tool_calls[{k}] must be {{id, type, function: {{name, arguments}}}} "
                                 "with the arguments as JSON text")

@dataclass(frozen=True)
class LoadRequest:
    """Load a model: how, whole, as one :class:`LoadOptions` (``path`` None: the embedded default model)."""

    id: str
    options: LoadOptions = LoadOptions()
    type: str = "load"


@dataclass(frozen=True)
class GenerateRequestMsg:
    """A reply to generate. ``sampling`` travels whole, as one
    :class:`SamplingParams` object (llama.cpp's server names inside), checked when
    the message is made: a value out of range is a ``protocol`` error naming it."""

    id: str
    prompt: str | None = None
    # {"role", "content"} and, with tools, assistant "tool_calls" (OpenAI's shape) and a tool
    # result's "tool_call_id" / "name" (check_messages says what may be in one)
    messages: list[dict[str, Any]] | None = None
    # how the next token is chosen, whole (llama.cpp's server names inside); checked when made
    sampling: SamplingParams = GREEDY
    max_tokens: int = 256
    stop: list[str] = field(default_factory=list)
    speculative: SpeculativeSettings = SPECULATION_OFF
    # tools the chat template renders, in OpenAI's shape {"type": "function", "function": {...}}
    tools: list[dict[str, Any]] | None = None
    # the output must follow this GBNF grammar (root rule "root"; engine/generation/grammars.py makes
    # one from a JSON schema)
    grammar: str | None = None
    # regular expressions: with any, the grammar is lazy (free output until one matches, constrained from
    # the match on; a tool call the model begins is then well formed)
    grammar_triggers: list[str] = field(default_factory=list)
    # false: the grammar holds the whole reply, even a thinking block the prompt opened (a raw grammar)
    grammar_after_thinking: bool = True
    # added to a token's logit before sampling, token id (as text, as OpenAI sends it) -> bias;
    # -100 or less bans the token
    logit_bias: dict[str, float] = field(default_factory=dict)
    # -1: none; k >= 0: each generated token's log-probability and its k most likely alternatives
    logprobs: int = -1
    # render the messages with this chat template instead of the model's (the server's generic
    # template for a model without one, when tools need a syntax)
    template: str | None = None
    # more variables for the chat template (a request's chat_template_kwargs, such as enable_thinking)
    template_kwargs: dict[str, Any] | None = None
    # the last message is the assistant's unfinished reply: the prompt ends inside it and the
    # reply goes on from its last word (the app's Continue; vLLM's and transformers' name)
    continue_final_message: bool = False
    # send the text of the reply's <think> block as token events marked reasoning (the server's APIs
    # carry it apart; the app shows the reply as written)
    split_reasoning: bool = False
    # encoded images (PNG, JPEG, …) as base64, one per IMAGE_MARKER in the prompt or the messages'
    # text, in order; the model must have a projector loaded (ModelInfo.vision)
    images: list[str] = field(default_factory=list)
    type: str = "generate"

    def __post_init__(self) -> None:
        check_messages(self.messages)
        if not -1 <= self.logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(f"logprobs must be from -1 to {MAX_TOP_LOGPROBS}, not {self.logprobs}")
        for token, bias in self.logit_bias.items():
            if not token.isdigit() or not math.isfinite(bias):
                raise ValueError(f"logit_bias maps token ids to finite numbers, not {token!r}: {bias!r}")


@dataclass(frozen=True)
class TokenizeRequest:
    """Text to tokens (``text``), or tokens to text (``tokens``), with the loaded model's vocabulary;
    answered by one ``tokens`` event."""

    id: str
    text: str | None = None
    tokens: list[int] | None = None
    add_special: bool = True  # a BOS where the model adds one
    type: str = "tokenize"

    def __post_init__(self) -> None:
        if (self.text is None) == (self.tokens is None):
            raise ValueError("tokenize needs exactly one of 'text' or 'tokens'")


@dataclass(frozen=True)
class CancelRequest:
    id: str
    target: str | None = None  # the generate request to cancel; None: whatever runs
    type: str = "cancel"


@dataclass(frozen=True)
class UnloadRequest:
    id: str
    type: str = "unload"


@dataclass(frozen=True)
class ShutdownRequest:
    id: str
    type: str = "shutdown"


REQUESTS: dict[str, type] = {
    "load": LoadRequest,
    "generate": GenerateRequestMsg,
    "tokenize": TokenizeRequest,
    "cancel": CancelRequest,
    "unload": UnloadRequest,
    "shutdown": ShutdownRequest,
}

FINISH_REASONS = ("stop", "length", "cancelled", "error")


def decode_request(line: str | bytes) -> Any:
    """Parse one request line (bytes must be UTF-8).

    Raises:
        ProtocolError: not UTF-8, not JSON, nested too deeply, not an object,
            text that is not Unicode (a lone surrogate escape), unknown type,
            or a bad field.
    """
    if isinstance(line, bytes):
        try:
            line = line.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ProtocolError(
                f"the request is not valid UTF-8 (byte 0x{line[exc.start]:02x} at offset {exc.start}); "
                "send JSON text encoded as UTF-8"
            ) from None
    try:
        data = json.loads(line)
    except RecursionError:
        raise ProtocolError("the request is nested too deeply to read; requests are flat JSON objects") from None
    except ValueError as exc:
        raise ProtocolError(f"malformed JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ProtocolError("a request must be a JSON object")
    bad = first_bad_text(data)
    if bad is not None:  # before any field is used: no text past here needs checking again
        raise ProtocolError(f"request: {bad.describe()}")
    kind = data.get("type")
    cls = REQUESTS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ProtocolError(f"unknown request type {kind!r}; expected one of {sorted(REQUESTS)}")
    return build(cls, data, str(kind))


def encode(message: Any) -> str:
    """One line of JSON for a request or an event."""
    data = dataclasses.asdict(message) if dataclasses.is_dataclass(message) and not isinstance(message, type) \
        else message
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))


def request_id(data: Any) -> str | None:
    """The id of a request that failed to decode, if one can be read (and written back: an id
    that is not Unicode cannot be, so the error goes out without one)."""
    try:
        value = json.loads(data).get("id")
    except Exception:
        return None
    return value if isinstance(value, str) and first_bad_text(value) is None else None
