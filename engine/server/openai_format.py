"""OpenAI request bodies in, worker requests out; worker results in, OpenAI
response objects out. Pure functions, no I/O, so every rule is testable alone.

Rules that matter to a client:
- Every parameter is checked; a wrong type or value is a 400 naming it. Text
  holding a lone surrogate (``"\\ud800"``), in a value or a name, is a 400
  ``invalid_text`` naming the field.
- A parameter that would change the result and is not supported (``n`` > 1,
  ``tools``, ``logprobs``, ``response_format`` other than text, ``logit_bias``,
  ``echo``, ``best_of`` > 1, ``suffix``) is a 400 naming it, never ignored.
  Unknown parameters are refused the same way. Parameters that cannot change
  the text (``user``, ``metadata``, ``store``, ``service_tier``) are accepted.
- Defaults follow OpenAI: ``temperature`` 1, ``top_p`` 1, no other sampler, no
  penalty. llama-server's ``top_k``, ``min_p``, ``repeat_penalty`` and
  ``repeat_last_n`` are accepted too.
- ``speculative`` (an extension): ``"auto"`` (the default: the model's autotune
  profile, else off), ``"off"``, ``"mtp"``, or an object
  ``{"mode": "mtp", "n_max": 3, "n_min": 0, "p_min": 0.0}``.
- Responses carry ``usage`` and, as llama-server's do, ``timings`` with the
  draft counts (``draft_n``, ``draft_n_accepted``), plus a ``speculative``
  object with the per-position acceptance.
"""

from __future__ import annotations

import math
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from engine.sampling import MAX_SEED, RANDOM_SEED, SamplingParams
from engine.speculative.settings import MODES, SpeculativeSettings
from engine.speculative.stats import StatsSnapshot
from engine.unicode_text import first_bad_text, printable

MAX_STOPS = 16
CHAT_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}

# Accepted, and they cannot change the text.
_INERT = {"user", "metadata", "store", "service_tier", "parallel_tool_calls"}
# Refused unless absent or at the value that means "off".
_OFF_VALUES: dict[str, tuple[Any, ...]] = {
    "n": (1,), "logprobs": (False, None), "top_logprobs": (None, 0), "tools": (None, []), "tool_choice": (None, "none"),
    "functions": (None, []), "function_call": (None, "none"), "logit_bias": (None, {}), "best_of": (None, 1),
    "echo": (False, None), "suffix": (None, ""), "audio": (None,), "modalities": (None, ["text"]),
    "prediction": (None,), "reasoning_effort": (None,), "web_search_options": (None,),
}
_SAMPLING = {"temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty", "frequency_penalty",
             "repeat_penalty", "repeat_last_n"}
_COMMON = {"model", "stream", "stream_options", "max_tokens", "stop", "speculative"} | _SAMPLING
CHAT_FIELDS = _COMMON | {"messages", "max_completion_tokens", "response_format"} | _INERT | set(_OFF_VALUES)
COMPLETION_FIELDS = _COMMON | {"prompt"} | _INERT | set(_OFF_VALUES)


class ApiError(Exception):
    """An error as OpenAI shapes it: ``{"error": {message, type, param, code}}``."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 type_: str = "invalid_request_error", headers: dict[str, str] | None = None) -> None:
        # a message or name may quote what the client sent; a lone surrogate in it would make the answer
        # itself unencodable (a 500 in place of this error)
        message, param = printable(message), None if param is None else printable(param)
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type_
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad(param: str, message: str, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, param=param, code=code)


@dataclass(frozen=True)
class ParsedRequest:
    """What a request asks the worker for, and how to answer."""

    model: str
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    sampling: dict[str, Any] = field(default_factory=dict)
    max_tokens: int = 0
    stop: list[str] = field(default_factory=list)
    speculative: SpeculativeSettings | None = None  # None: the server's default
    stream: bool = False
    include_usage: bool = False
    # tools in OpenAI's shape ({"type": "function", "function": {name, description, parameters}});
    # messages may then carry ``tool_calls`` (assistant) and ``tool_call_id`` (role "tool")
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] = "auto"  # auto | none | required | {"type": "function", "function": {...}}
    grammar: str | None = None  # GBNF the output must follow (llama-server's ``grammar``)
    json_schema: dict[str, Any] | None = None  # the output must be JSON of this schema ({} : any JSON object)
    logprobs: int | None = None  # None: none; k: the chosen token's and k alternatives
    logit_bias: dict[int, float] = field(default_factory=dict)
    n: int = 1


# -- checking -------------------------------------------------------------------
def check_text(body: Any) -> None:
    """Refuse a body holding a lone surrogate anywhere (a value or a name), naming the field: such text
    cannot be tokenized, sent to the worker or even quoted in an error."""
    found = first_bad_text(body)
    if found is not None:
        raise bad(found.top or "body", found.describe(), "invalid_text")


def _number(body: dict[str, Any], name: str, default: float) -> float:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise bad(name, f"'{name}' must be a number, not {value!r}", "invalid_type")
    return float(value)


def _integer(body: dict[str, Any], name: str, default: int | None) -> int | None:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad(name, f"'{name}' must be an integer, not {value!r}", "invalid_type")
    return value


def _refuse_unsupported(body: dict[str, Any], allowed: set[str]) -> None:
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise bad(unknown[0], f"Unrecognized request argument supplied: {unknown[0]}", "unknown_parameter")
    for name, off in _OFF_VALUES.items():
        if name in body and body[name] not in off:
            raise bad(name, f"'{name}' is not supported by this server (it would change the result); "
                      f"leave it out or set it to {off[0]!r}", "unsupported_parameter")
    fmt = body.get("response_format")
    if fmt is not None and fmt != {"type": "text"}:
        raise bad("response_format", "Only response_format {'type': 'text'} is supported", "unsupported_parameter")


def _stop(body: dict[str, Any]) -> list[str]:
    value = body.get("stop")
    if value is None:
        return []
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise bad("stop", f"'stop' must be a string or a list of strings, not {value!r}", "invalid_type")
    if len(stops) > MAX_STOPS:
        raise bad("stop", f"'stop' may hold at most {MAX_STOPS} strings, not {len(stops)}")
    return [s for s in stops if s]


def _stream(body: dict[str, Any]) -> tuple[bool, bool]:
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise bad("stream", f"'stream' must be true or false, not {stream!r}", "invalid_type")
    options = body.get("stream_options")
    if options is None:
        return stream, False
    if not isinstance(options, dict) or not set(options) <= {"include_usage", "include_obfuscation"}:
        raise bad("stream_options", "'stream_options' may hold only 'include_usage'", "invalid_type")
    if not stream:
        raise bad("stream_options", "'stream_options' is only allowed when 'stream' is true")
    include = options.get("include_usage", False)
    if not isinstance(include, bool):
        raise bad("stream_options", "'stream_options.include_usage' must be true or false", "invalid_type")
    return stream, include


def speculative_from(value: Any) -> SpeculativeSettings | None:
    """The ``speculative`` extension field; None for "auto" (the server's default)."""
    if value is None or value == "auto":
        return None
    if isinstance(value, str):
        value = {"mode": value}
    if not isinstance(value, dict):
        raise bad("speculative", "'speculative' must be \"auto\", \"off\", \"mtp\" or an object", "invalid_type")
    unknown = sorted(set(value) - {"mode", "n_max", "n_min", "p_min"})
    if unknown:
        raise bad("speculative", f"'speculative' has unknown field(s) {unknown}; it takes mode, n_max, n_min, p_min")
    if value.get("mode", "mtp") not in MODES:
        raise bad("speculative", f"'speculative.mode' must be one of {['auto', *MODES]}, not {value.get('mode')!r}")
    try:
        return SpeculativeSettings(mode=value.get("mode", "mtp"), n_max=value.get("n_max", 3),
                                   n_min=value.get("n_min", 0), p_min=value.get("p_min", 0.0))
    except ValueError as exc:
        raise bad("speculative", f"'speculative': {exc}") from None


def _sampling(body: dict[str, Any]) -> dict[str, Any]:
    seed = _integer(body, "seed", None)
    if seed is not None and not 0 <= seed <= MAX_SEED:
        raise bad("seed", f"'seed' must be from 0 to {MAX_SEED}, not {seed}")
    values: dict[str, Any] = {
        "temperature": _number(body, "temperature", 1.0), "top_p": _number(body, "top_p", 1.0),
        "top_k": _integer(body, "top_k", 0), "min_p": _number(body, "min_p", 0.0),
        "presence_penalty": _number(body, "presence_penalty", 0.0),
        "frequency_penalty": _number(body, "frequency_penalty", 0.0),
        "repeat_penalty": _number(body, "repeat_penalty", 1.0), "repeat_last_n": _integer(body, "repeat_last_n", 64),
        "seed": RANDOM_SEED if seed is None else seed,
    }
    try:
        SamplingParams(**values)
    except ValueError as exc:  # the message starts with the field's name
        name = str(exc).split(" ", 1)[0]
        raise bad(name if name in _SAMPLING else "temperature", f"'{name}': {exc}") from None
    return values


def _max_tokens(body: dict[str, Any], default: int, *names: str) -> int:
    for name in names:
        value = _integer(body, name, None)
        if value is not None:
            if value < 1:
                raise bad(name, f"'{name}' must be 1 or more, not {value}")
            return value
    return default


def _model(body: dict[str, Any], served: tuple[str, ...]) -> str:
    model = body.get("model")
    if not isinstance(model, str):
        raise bad("model", f"'model' must be a string naming the model, not {model!r}", "invalid_type")
    if model not in served:
        raise bad("model", f"The model '{model}' is not served here; this server serves {served[0]!r} "
                  "(GET /v1/models lists it)", "model_not_found")
    return served[0]


def _message_text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise bad("messages", f"{where}.content: only text parts are supported (no images or audio)",
                          "unsupported_parameter")
            parts.append(part["text"])
        return "".join(parts)
    raise bad("messages", f"{where}.content must be a string or a list of text parts", "invalid_type")


def _messages(body: dict[str, Any]) -> list[dict[str, str]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad("messages", "'messages' must be a non-empty list of {role, content} objects", "invalid_type")
    out = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise bad("messages", f"{where} must be an object", "invalid_type")
        role = message.get("role")
        if not isinstance(role, str) or role not in CHAT_ROLES:
            raise bad("messages", f"{where}.role {role!r} is not supported; use system, user or assistant",
                      "unsupported_parameter")
        if message.get("tool_calls") or message.get("function_call"):
            raise bad("messages", f"{where}: tool calls are not supported", "unsupported_parameter")
        out.append({"role": CHAT_ROLES[role], "content": _message_text(message.get("content"), where)})
    return out


def parse_chat(body: Any, served: tuple[str, ...], n_ctx: int) -> ParsedRequest:
    """A ``/v1/chat/completions`` body, every field checked. Raises :class:`ApiError`."""
    if not isinstance(body, dict):
        raise bad("body", "The request body must be a JSON object", "invalid_type")
    check_text(body)
    _refuse_unsupported(body, CHAT_FIELDS)
    model = _model(body, served)
    stream, include_usage = _stream(body)
    return ParsedRequest(model=model, messages=_messages(body), sampling=_sampling(body),
                         max_tokens=_max_tokens(body, n_ctx, "max_completion_tokens", "max_tokens"),
                         stop=_stop(body), speculative=speculative_from(body.get("speculative")),
                         stream=stream, include_usage=include_usage)


def parse_completion(body: Any, served: tuple[str, ...], n_ctx: int) -> ParsedRequest:
    """A ``/v1/completions`` body (one prompt string). Raises :class:`ApiError`."""
    if not isinstance(body, dict):
        raise bad("body", "The request body must be a JSON object", "invalid_type")
    check_text(body)
    _refuse_unsupported(body, COMPLETION_FIELDS)
    model = _model(body, served)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise bad("prompt", "'prompt' must be one string (lists of prompts and token arrays are not supported)",
                  "invalid_type")
    stream, include_usage = _stream(body)
    return ParsedRequest(model=model, prompt=prompt, sampling=_sampling(body),
                         max_tokens=_max_tokens(body, 16, "max_tokens"), stop=_stop(body),
                         speculative=speculative_from(body.get("speculative")), stream=stream,
                         include_usage=include_usage)


# -- answering --------------------------------------------------------------------
def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(12)}"


def now() -> int:
    return int(time.time())


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def timings(stats: StatsSnapshot | None, n_tokens: int) -> dict[str, Any]:
    """llama-server's ``timings`` object, draft counts included."""
    if stats is None:
        return {}
    prompt_s = stats.phase_seconds.get("prefill", 0.0)
    predicted_s = max(stats.elapsed - prompt_s, 0.0)
    decoded = stats.prompt_tokens - stats.prompt_reused  # as llama-server counts: prompt_n excludes cache_n
    return {
        "cache_n": stats.prompt_reused,
        "prompt_n": decoded, "prompt_ms": prompt_s * 1000,
        "prompt_per_token_ms": prompt_s * 1000 / decoded if decoded else None,
        "prompt_per_second": stats.prompt_tps,
        "predicted_n": n_tokens, "predicted_ms": predicted_s * 1000,
        "predicted_per_token_ms": predicted_s * 1000 / n_tokens if n_tokens else None,
        "predicted_per_second": stats.decode_tps if stats.decode_tps is not None
        else (n_tokens / predicted_s if predicted_s > 0 and n_tokens else None),
        "draft_n": stats.drafted, "draft_n_accepted": stats.accepted,
    }


def speculative_report(stats: StatsSnapshot | None, setting: SpeculativeSettings) -> dict[str, Any]:
    """What MTP did for this request (an extension beside ``timings``)."""
    report: dict[str, Any] = {"mode": setting.mode, "n_max": setting.n_max if setting.enabled else 0}
    if stats is not None:
        report.update(drafted=stats.drafted, accepted=stats.accepted, acceptance_rate=stats.acceptance_rate,
                      mean_accepted_length=stats.mean_accepted_length,
                      acceptance_per_pos=stats.acceptance_per_pos, rollback=stats.rollback,
                      drafted_by_source=stats.drafted_by_source, accepted_by_source=stats.accepted_by_source)
    return report


def chat_chunk(rid: str, created: int, model: str, delta: dict[str, str], finish: str | None,
               include_usage: bool) -> dict[str, Any]:
    chunk = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
             "system_fingerprint": None,
             "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
    if include_usage:
        chunk["usage"] = None
    return chunk


def completion_chunk(rid: str, created: int, model: str, text: str, finish: str | None,
                     include_usage: bool) -> dict[str, Any]:
    chunk = {"id": rid, "object": "text_completion", "created": created, "model": model,
             "system_fingerprint": None,
             "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]}
    if include_usage:
        chunk["usage"] = None
    return chunk


def usage_chunk(rid: str, created: int, model: str, kind: str, usage_: dict[str, int]) -> dict[str, Any]:
    """The last chunk of a stream with ``include_usage``: no choices, the usage."""
    obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
    return {"id": rid, "object": obj, "created": created, "model": model, "system_fingerprint": None,
            "choices": [], "usage": usage_}


def chat_completion(rid: str, created: int, model: str, text: str, finish: str) -> dict[str, Any]:
    return {"id": rid, "object": "chat.completion", "created": created, "model": model, "system_fingerprint": None,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text, "refusal": None},
                         "logprobs": None, "finish_reason": finish}]}


def completion(rid: str, created: int, model: str, text: str, finish: str) -> dict[str, Any]:
    return {"id": rid, "object": "text_completion", "created": created, "model": model, "system_fingerprint": None,
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]}
