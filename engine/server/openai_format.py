"""OpenAI request bodies in, worker requests out; worker results in, OpenAI
response objects out. Pure functions, no I/O, so every rule is testable alone.

Rules that matter to a client:
- Every parameter is checked; a wrong type or value is a 400 naming it. Text
  holding a lone surrogate (``"\\ud800"``), in a value or a name, is a 400
  ``invalid_text`` naming the field.
- ``tools`` / ``tool_choice`` (and the legacy ``functions`` / ``function_call``),
  ``response_format`` (text, json_object, json_schema), llama-server's
  ``grammar`` and ``json_schema``, ``logprobs`` / ``top_logprobs``,
  ``logit_bias`` and ``n`` are honoured.
- A parameter that would change the result and is not supported (``echo``,
  ``best_of`` > 1, ``suffix``, audio) is a 400 naming it, never ignored.
  Unknown parameters are refused the same way. Parameters that cannot change
  the text are accepted: OpenAI's ``user``, ``metadata``, ``store``,
  ``service_tier``, ``parallel_tool_calls``, and llama-server's ``cache_prompt``,
  ``id_slot``, ``timings_per_token`` and the others in ``LLAMA_SERVER_INERT``
  (some only at the value that means "off").
- ``image_url`` content parts: data URLs; local files only on a server started
  with ``--allow-local-images``; remote URLs are refused (400), never fetched;
  a model without a vision projector refuses images (400, ``plan.make``).
- Any ``model``, or none, is served by the loaded model (the response names it),
  as llama-server does; ``strict_model`` refuses other names.
- Defaults follow OpenAI: ``temperature`` 1, ``top_p`` 1, no other sampler, no
  penalty. llama-server's ``top_k``, ``min_p``, ``repeat_penalty`` and
  ``repeat_last_n`` are accepted too.
- ``speculative`` (an extension): ``"auto"`` (the default: the model's autotune
  profile, else off), ``"off"``, ``"mtp"``, or an object
  ``{"mode": "mtp", "n_max": 3, "n_min": 0, "p_min": 0.0, "draft_sampling": "match"}``
  (``"probabilistic"``: sampled drafts kept by rejection sampling, docs/mtp.md).
- Responses carry ``usage`` and, as llama-server's do, ``timings`` with the
  draft counts (``draft_n``, ``draft_n_accepted``), plus a ``speculative``
  object with the per-position acceptance.
"""

from __future__ import annotations

import json
import math
import secrets
import time
from dataclasses import dataclass, field, fields
from typing import Any

from engine.errors import ImageError
from engine.generation.image_sources import IMAGE_PART_TYPES, image_source
from engine.sampling import GREEDY, MAX_SEED, SamplingParams
from engine.server.reply import Reply, TokenLogprob, ToolCall
from engine.speculative.settings import MATCH, MODES, SpeculativeSettings
from engine.speculative.stats import StatsSnapshot
from engine.unicode_text import first_bad_text, printable
from engine.worker.protocol import IMAGE_MARKER, MAX_TOP_LOGPROBS  # as OpenAI's

MAX_STOPS = 16
CHAT_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}

MAX_N = 8  # choices per request (each is one generation, one after another)
# Accepted, and they cannot change the text.
_INERT = {"user", "metadata", "store", "service_tier", "parallel_tool_calls", "prompt_cache_key", "safety_identifier"}
# llama-server's fields that change nothing here: the cache is always used (prefix reuse), one slot,
# timings always sent; those that name a sampler are accepted only at the value that turns it off.
LLAMA_SERVER_INERT = {"cache_prompt", "id_slot", "timings_per_token", "return_progress", "n_keep", "n_indent",
                      "t_max_prompt_ms", "samplers", "post_sampling_probs", "return_tokens", "n_cmpl"}
# Refused unless absent or at the value that means "off".
_OFF_VALUES: dict[str, tuple[Any, ...]] = {
    "best_of": (None, 1), "echo": (False, None), "suffix": (None, ""), "audio": (None,),
    "modalities": (None, ["text"]), "prediction": (None,), "reasoning_effort": (None,),
    "web_search_options": (None,),
    # llama-server's samplers at their "off" values
    "typical_p": (None, 1, 1.0), "mirostat": (None, 0), "dynatemp_range": (None, 0, 0.0),
    "xtc_probability": (None, 0, 0.0), "dry_multiplier": (None, 0, 0.0), "ignore_eos": (None, False),
    "n_probs": (None, 0), "t_max_predict_ms": (None, 0), "min_keep": (None, 0, 1),
}
_SAMPLING = {f.name for f in fields(SamplingParams)}  # llama-server's names, each a field of the request
# A request's sampling where it leaves a field out: OpenAI's temperature and top_p (1: plain sampling),
# llama-server's other samplers off; a new seed each time
DEFAULT_SAMPLING = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
_COMMON = {"model", "stream", "stream_options", "max_tokens", "stop", "speculative", "n", "logit_bias",
           "logprobs", "grammar", "json_schema"} | _SAMPLING
_TOOLS = {"tools", "tool_choice", "functions", "function_call", "response_format", "top_logprobs",
          "max_completion_tokens", "chat_template_kwargs", "reasoning_format"}
CHAT_FIELDS = _COMMON | {"messages"} | _TOOLS | _INERT | LLAMA_SERVER_INERT | set(_OFF_VALUES)
COMPLETION_FIELDS = _COMMON | {"prompt"} | _INERT | LLAMA_SERVER_INERT | set(_OFF_VALUES)


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
    sampling: SamplingParams = GREEDY
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
    template_kwargs: dict[str, Any] | None = None  # chat_template_kwargs (enable_thinking, …)
    split_reasoning: bool = True  # a <think> block's text apart from the answer (reasoning_format "none": not)
    # where the messages' images come from (data URLs, local paths), one per image marker in their text
    images: list[str] = field(default_factory=list)


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
        if name in body and not any(body[name] == value and type(body[name]) is type(value) for value in off):
            shown = next((v for v in off if v is not None), None)
            raise bad(name, f"'{name}' is not supported by this server (it would change the result); "
                      f"leave it out or set it to {shown!r}", "unsupported_parameter")


def stop_strings(value: Any, param: str = "stop") -> list[str]:
    """A stop field (a string or a list of strings) checked, empty ones left out; ``param`` names it in errors."""
    if value is None:
        return []
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise bad(param, f"'{param}' must be a string or a list of strings, not {value!r}", "invalid_type")
    if len(stops) > MAX_STOPS:
        raise bad(param, f"'{param}' may hold at most {MAX_STOPS} strings, not {len(stops)}")
    return [s for s in stops if s]


def _stop(body: dict[str, Any]) -> list[str]:
    return stop_strings(body.get("stop"))


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
    unknown = sorted(set(value) - {"mode", "n_max", "n_min", "p_min", "draft_sampling"})
    if unknown:
        raise bad("speculative", f"'speculative' has unknown field(s) {unknown}; "
                                 "it takes mode, n_max, n_min, p_min, draft_sampling")
    if value.get("mode", "mtp") not in MODES:
        raise bad("speculative", f"'speculative.mode' must be one of {['auto', *MODES]}, not {value.get('mode')!r}")
    try:
        return SpeculativeSettings(mode=value.get("mode", "mtp"), n_max=value.get("n_max", 3),
                                   n_min=value.get("n_min", 0), p_min=value.get("p_min", 0.0),
                                   draft_sampling=value.get("draft_sampling", MATCH))
    except ValueError as exc:
        raise bad("speculative", f"'speculative': {exc}") from None


def _sampling(body: dict[str, Any], defaults: SamplingParams = DEFAULT_SAMPLING) -> SamplingParams:
    """The sampling a request asks for: each field from ``body``, else from ``defaults`` (its API's own).

    Raises:
        ApiError: a value of the wrong type or out of range, naming the field.
    """
    seed = _integer(body, "seed", None)
    if seed is not None and not 0 <= seed <= MAX_SEED:
        raise bad("seed", f"'seed' must be from 0 to {MAX_SEED}, not {seed}")
    values: dict[str, Any] = {"seed": defaults.seed if seed is None else seed}
    for f in fields(SamplingParams):
        default = getattr(defaults, f.name)
        if f.name != "seed":  # an integer field (top_k, repeat_last_n) refuses 1.5; a number takes 1
            values[f.name] = _integer(body, f.name, default) if isinstance(default, int) \
                else _number(body, f.name, default)
    try:
        return SamplingParams(**values)
    except ValueError as exc:  # the message starts with the field's name
        name = str(exc).split(" ", 1)[0]
        raise bad(name if name in _SAMPLING else "temperature", f"'{name}': {exc}") from None


def _max_tokens(body: dict[str, Any], default: int, *names: str) -> int:
    for name in names:
        value = _integer(body, name, None)
        if value is not None:
            if value < 1:
                raise bad(name, f"'{name}' must be 1 or more, not {value}")
            return value
    return default


def model_name(body: dict[str, Any], served: tuple[str, ...], strict: bool = False) -> str:
    """The id to answer with: the loaded model's, whatever the request named, unless ``strict``."""
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad("model", f"'model' must be a string naming the model, not {model!r}", "invalid_type")
    if strict and model not in served:
        raise bad("model", f"The model '{model}' is not served here; this server serves {served[0]!r} "
                  "(GET /v1/models lists it)", "model_not_found")
    return served[0]


def _message_text(content: Any, where: str, images: list[str]) -> str:
    """A message's content as text; each image part becomes the worker's image marker, and its
    source (a data URL or a local path) is appended to ``images``."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if isinstance(content, list):
        parts = []
        for k, part in enumerate(content):
            if isinstance(part, dict) and part.get("type") in IMAGE_PART_TYPES:
                parts.append(take_image(part, f"{where}.content[{k}]", images))
                continue
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise bad("messages", f"{where}.content: only text and image_url parts are supported (no audio)",
                          "unsupported_parameter")
            parts.append(part["text"])
        return "".join(parts)
    raise bad("messages", f"{where}.content must be a string or a list of text and image_url parts", "invalid_type")


def take_image(part: dict[str, Any], where: str, images: list[str], param: str = "messages") -> str:
    """One image part of any of the server's APIs: the source it names (a data URL or a local path) appended
    to ``images``, and the worker's image marker returned, to stand in the text where the image stood.
    A remote URL is refused here (it is never fetched). Every API's images go through this and
    ``plan.make``, which refuses them on a model without a projector and reads each with ``read_image``."""
    try:
        source = image_source(part)
    except ImageError as exc:
        raise bad(param, f"{where}: {exc}", "invalid_type") from None
    return take_source(source, where, images, param)


def take_source(source: str, where: str, images: list[str], param: str = "messages") -> str:
    """:func:`take_image` for an API whose image is its source already (a URL, a path or a data URL)."""
    if source.startswith(("http://", "https://")):
        raise bad(param, f"{where}: remote image URLs are not fetched ({source[:80]}); send the image itself "
                  "as a data:image/…;base64 URL", "unsupported_parameter")
    images.append(source)
    return IMAGE_MARKER


def _arguments_text(value: Any, where: str) -> str:
    """A call's arguments as JSON object text (clients send text; some send the object)."""
    if isinstance(value, dict):
        return json.dumps(value, ensure_ascii=False)
    if value is None or value == "":
        return "{}"
    if not isinstance(value, str):
        raise bad("messages", f"{where}.arguments must be JSON text", "invalid_type")
    return value


def _tool_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(calls, list):
        raise bad("messages", f"{where}.tool_calls must be a list", "invalid_type")
    out = []
    for k, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise bad("messages", f"{where}.tool_calls[{k}] must be {{id, type: 'function', function: {{name, "
                      "arguments}}}}", "invalid_type")
        call_id = call.get("id")
        out.append({"id": call_id if isinstance(call_id, str) else f"call_{k}", "type": "function",
                    "function": {"name": function["name"],
                                 "arguments": _arguments_text(function.get("arguments"), f"{where}.tool_calls[{k}]")}})
    return out


def _messages(body: dict[str, Any], images: list[str]) -> list[dict[str, Any]]:
    """The chat's messages, checked; the sources of their images are appended to ``images``, in order."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad("messages", "'messages' must be a non-empty list of {role, content} objects", "invalid_type")
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise bad("messages", f"{where} must be an object", "invalid_type")
        role = message.get("role")
        if not isinstance(role, str) or role not in CHAT_ROLES and role not in ("tool", "function"):
            raise bad("messages", f"{where}.role {role!r} is not supported; use system, user, assistant or tool",
                      "unsupported_parameter")
        entry: dict[str, Any] = {"role": CHAT_ROLES.get(role, "tool"),
                                 "content": _message_text(message.get("content"), where, images)}
        calls = message.get("tool_calls")
        if message.get("function_call"):  # the legacy single call
            calls = [{"id": "call_0", "type": "function", "function": message["function_call"]}]
        if calls:
            if role != "assistant":
                raise bad("messages", f"{where}: only an assistant message carries tool_calls", "invalid_value")
            entry["tool_calls"] = _tool_calls(calls, where)
        if role in ("tool", "function"):
            for key in ("tool_call_id", "name"):
                if isinstance(message.get(key), str):
                    entry[key] = message[key]
        out.append(entry)
    return out


def function_tool(where: str, name: Any, parameters: Any, description: Any, strict: Any = None,
                  schema_field: str = "parameters") -> dict[str, Any]:
    """One function tool in the internal (OpenAI) shape, each field checked; ``where`` and
    ``schema_field`` name them in the errors as the client's API names them."""
    if not isinstance(name, str) or not name or len(name) > 128:
        raise bad("tools", f"{where}.name must be a non-empty string", "invalid_type")
    if parameters is None:
        parameters = {"type": "object", "properties": {}}
    if not isinstance(parameters, dict):
        raise bad("tools", f"{where}.{schema_field} must be a JSON schema object", "invalid_type")
    if description is not None and not isinstance(description, str):
        raise bad("tools", f"{where}.description must be a string", "invalid_type")
    function: dict[str, Any] = {"name": name, "description": description or "", "parameters": parameters}
    if strict is True:
        function["strict"] = True
    return {"type": "function", "function": function}


def function_tools(tools: Any) -> list[dict[str, Any]]:
    """A list of OpenAI-shaped function tools (as OpenAI's and Ollama's clients send them), checked."""
    if not isinstance(tools, list):
        raise bad("tools", "'tools' must be a list of {type: 'function', function: {...}} objects", "invalid_type")
    out = []
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type", "function") != "function" or not isinstance(function, dict):
            raise bad("tools", f"tools[{i}] must be {{type: 'function', function: {{name, description, "
                      "parameters}}}}; other tool types are not supported", "invalid_type")
        out.append(function_tool(f"tools[{i}].function", function.get("name"), function.get("parameters"),
                                 function.get("description"), function.get("strict")))
    return out


def _tools(body: dict[str, Any]) -> tuple[list[dict[str, Any]] | None, str | dict[str, Any]]:
    """``tools`` and ``tool_choice`` (or the legacy ``functions`` and ``function_call``), checked."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if body.get("functions") is not None:  # legacy: one function per tool
        tools = [{"type": "function", "function": f} for f in body["functions"]] \
            if isinstance(body["functions"], list) else body["functions"]
        legacy = body.get("function_call")
        choice = {"type": "function", "function": legacy} if isinstance(legacy, dict) else legacy
    if tools is None or tools == []:
        if choice not in (None, "none", "auto"):
            raise bad("tool_choice", "'tool_choice' needs 'tools'")
        return None, "none"
    out = function_tools(tools)
    names = [tool["function"]["name"] for tool in out]
    if choice is None:
        choice = "auto"
    if isinstance(choice, dict):
        wanted = (choice.get("function") or {}).get("name") if isinstance(choice.get("function"), dict) else None
        if not isinstance(wanted, str) or wanted not in names:
            raise bad("tool_choice", f"'tool_choice' names a function that is not among the tools ({names})")
        return out, {"type": "function", "function": {"name": wanted}}
    if choice not in ("auto", "none", "required"):
        raise bad("tool_choice", "'tool_choice' must be auto, none, required or {type: 'function', function: "
                  "{name}}")
    return out, choice


def _json_schema(body: dict[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    """What the output must be: a JSON schema ({} any object) from ``response_format`` or
    llama-server's ``json_schema``, or llama-server's GBNF ``grammar``."""
    fmt, schema, grammar = body.get("response_format"), body.get("json_schema"), body.get("grammar")
    if grammar is not None and not isinstance(grammar, str):
        raise bad("grammar", "'grammar' must be GBNF text", "invalid_type")
    if schema is not None and not isinstance(schema, dict):
        raise bad("json_schema", "'json_schema' must be a JSON schema object", "invalid_type")
    if fmt is not None:
        kind = fmt.get("type") if isinstance(fmt, dict) else None
        if kind == "json_object":
            schema = {}
        elif kind == "json_schema":
            spec = fmt.get("json_schema")
            inner = spec.get("schema", {}) if isinstance(spec, dict) else None
            if not isinstance(inner, dict):
                raise bad("response_format", "response_format.json_schema must be {name, schema, strict}",
                          "invalid_type")
            schema = inner or {"type": "object"}
        elif kind != "text":
            raise bad("response_format", "response_format.type must be text, json_object or json_schema",
                      "invalid_value")
    if schema is not None and grammar:
        raise bad("grammar", "send a grammar or a JSON schema (response_format), not both")
    return schema, grammar or None


def _logprobs(body: dict[str, Any], chat: bool) -> int | None:
    if chat:
        wanted, top = body.get("logprobs"), _integer(body, "top_logprobs", None)
        if wanted not in (None, True, False):
            raise bad("logprobs", "'logprobs' must be true or false", "invalid_type")
        if top is not None and not wanted:
            raise bad("top_logprobs", "'top_logprobs' needs 'logprobs': true")
        if not wanted:
            return None
        top = top or 0
        if not 0 <= top <= MAX_TOP_LOGPROBS:
            raise bad("top_logprobs", f"'top_logprobs' must be from 0 to {MAX_TOP_LOGPROBS}")
        return top
    top = _integer(body, "logprobs", None)  # the legacy endpoint: how many alternatives
    if top is None:
        return None
    if not 0 <= top <= 5:
        raise bad("logprobs", "'logprobs' must be from 0 to 5")
    return top


def _logit_bias(body: dict[str, Any]) -> dict[int, float]:
    value = body.get("logit_bias")
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise bad("logit_bias", "'logit_bias' must map token ids to numbers from -100 to 100", "invalid_type")
    out = {}
    for token, bias in value.items():
        if not str(token).isdigit() or isinstance(bias, bool) or not isinstance(bias, int | float) \
                or not -100 <= bias <= 100:
            raise bad("logit_bias", f"'logit_bias' maps token ids to numbers from -100 to 100, not "
                      f"{token!r}: {bias!r}", "invalid_value")
        out[int(token)] = float(bias)
    return out


def _template_kwargs(body: dict[str, Any]) -> dict[str, Any] | None:
    value = body.get("chat_template_kwargs")
    if value is not None and not isinstance(value, dict):
        raise bad("chat_template_kwargs", "'chat_template_kwargs' must be an object of template variables",
                  "invalid_type")
    return value or None


def _split_reasoning(body: dict[str, Any]) -> bool:
    """llama-server's ``reasoning_format``: ``none`` leaves a <think> block in the content."""
    value = body.get("reasoning_format", "auto")
    if value not in ("auto", "deepseek", "deepseek-legacy", "none", None):
        raise bad("reasoning_format", "'reasoning_format' must be auto, deepseek or none")
    return value != "none"


def _n(body: dict[str, Any], stream: bool) -> int:
    n = _integer(body, "n", 1) or 1
    if not 1 <= n <= MAX_N:
        raise bad("n", f"'n' must be from 1 to {MAX_N}")
    if n > 1 and stream:
        raise bad("n", "'n' > 1 is not supported with 'stream': true here; ask for the choices without streaming",
                  "unsupported_parameter")
    return n


def parse_chat(body: Any, served: tuple[str, ...], n_ctx: int, strict_model: bool = False) -> ParsedRequest:
    """A ``/v1/chat/completions`` body, every field checked. Raises :class:`ApiError`."""
    if not isinstance(body, dict):
        raise bad("body", "The request body must be a JSON object", "invalid_type")
    check_text(body)
    _refuse_unsupported(body, CHAT_FIELDS)
    model = model_name(body, served, strict_model)
    stream, include_usage = _stream(body)
    tools, tool_choice = _tools(body)
    schema, grammar = _json_schema(body)
    images: list[str] = []
    messages = _messages(body, images)
    return ParsedRequest(model=model, messages=messages, images=images, sampling=_sampling(body),
                         max_tokens=_max_tokens(body, n_ctx, "max_completion_tokens", "max_tokens"),
                         stop=_stop(body), speculative=speculative_from(body.get("speculative")),
                         stream=stream, include_usage=include_usage, tools=tools, tool_choice=tool_choice,
                         json_schema=schema, grammar=grammar, logprobs=_logprobs(body, chat=True),
                         logit_bias=_logit_bias(body), n=_n(body, stream), template_kwargs=_template_kwargs(body),
                         split_reasoning=_split_reasoning(body))


def parse_completion(body: Any, served: tuple[str, ...], n_ctx: int, strict_model: bool = False) -> ParsedRequest:
    """A ``/v1/completions`` body (one prompt string). Raises :class:`ApiError`."""
    if not isinstance(body, dict):
        raise bad("body", "The request body must be a JSON object", "invalid_type")
    check_text(body)
    _refuse_unsupported(body, COMPLETION_FIELDS)
    model = model_name(body, served, strict_model)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise bad("prompt", "'prompt' must be one string (lists of prompts and token arrays are not supported)",
                  "invalid_type")
    stream, include_usage = _stream(body)
    schema, grammar = _json_schema(body)
    return ParsedRequest(model=model, prompt=prompt, sampling=_sampling(body),
                         max_tokens=_max_tokens(body, 16, "max_tokens"), stop=_stop(body),
                         speculative=speculative_from(body.get("speculative")), stream=stream,
                         include_usage=include_usage, json_schema=schema, grammar=grammar,
                         logprobs=_logprobs(body, chat=False), logit_bias=_logit_bias(body), n=_n(body, stream))


# -- answering --------------------------------------------------------------------
def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(12)}"


def now() -> int:
    return int(time.time())


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict[str, Any]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def reply_usage(replies: list[Reply]) -> dict[str, Any]:
    """Usage over a request's choices: the prompt once, every choice's tokens."""
    return usage(replies[0].prompt_tokens, sum(r.completion_tokens for r in replies), replies[0].cached_tokens)


def fingerprint(engine: Any) -> str | None:
    """``system_fingerprint``: the engine build that answered (version, backend, patch series)."""
    if engine is None:
        return None
    patches = f"-{engine.patch_hash[:8]}" if engine.patch_hash else ""
    return f"mtp-studio-llama-cpp-python-{engine.llama_cpp_python}-{engine.backend}{patches}"


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
    """What MTP did for this request (an extension beside ``timings``): the settings that ran (the
    model's limits applied), from the statistics; ``setting`` (what was asked) when there are none."""
    if stats is not None:
        setting = stats.settings
    report: dict[str, Any] = {"mode": setting.mode, "n_max": setting.n_max if setting.enabled else 0}
    if stats is not None:
        report.update(drafted=stats.drafted, accepted=stats.accepted, acceptance_rate=stats.acceptance_rate,
                      mean_accepted_length=stats.mean_accepted_length,
                      acceptance_per_pos=stats.acceptance_per_pos, rollback=stats.rollback,
                      drafted_by_source=stats.drafted_by_source, accepted_by_source=stats.accepted_by_source)
    return report


def chat_logprobs(entries: tuple[TokenLogprob, ...] | None) -> dict[str, Any] | None:
    """A choice's ``logprobs`` as the chat API shapes it."""
    if entries is None:
        return None
    return {"content": [{"token": e.token, "logprob": e.logprob, "bytes": e.bytes,
                         "top_logprobs": [{"token": t, "logprob": lp, "bytes": b} for t, lp, b in e.top]}
                        for e in entries], "refusal": None}


def completion_logprobs(entries: tuple[TokenLogprob, ...] | None) -> dict[str, Any] | None:
    """A choice's ``logprobs`` as the legacy completions API shapes it (tokens, offsets, top maps)."""
    if entries is None:
        return None
    offsets, at = [], 0
    for e in entries:
        offsets.append(at)
        at += len(e.token)
    return {"tokens": [e.token for e in entries], "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [{t: lp for t, lp, _ in e.top} for e in entries], "text_offset": offsets}


def tool_call_objects(calls: tuple[ToolCall, ...]) -> list[dict[str, Any]]:
    return [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls]


def chat_message(reply: Reply) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.content or (None if reply.tool_calls else ""),
                               "refusal": None}
    if reply.tool_calls:
        message["tool_calls"] = tool_call_objects(reply.tool_calls)
    if reply.reasoning:
        message["reasoning_content"] = reply.reasoning  # as llama-server names it
    return message


def chat_chunk(rid: str, created: int, model: str, delta: dict[str, Any], finish: str | None,
               include_usage: bool, system_fingerprint: str | None = None,
               logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
    chunk = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
             "system_fingerprint": system_fingerprint,
             "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]}
    if include_usage:
        chunk["usage"] = None
    return chunk


def completion_chunk(rid: str, created: int, model: str, text: str, finish: str | None,
                     include_usage: bool, system_fingerprint: str | None = None,
                     logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
    chunk = {"id": rid, "object": "text_completion", "created": created, "model": model,
             "system_fingerprint": system_fingerprint,
             "choices": [{"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish}]}
    if include_usage:
        chunk["usage"] = None
    return chunk


def usage_chunk(rid: str, created: int, model: str, kind: str, usage_: dict[str, Any],
                system_fingerprint: str | None = None) -> dict[str, Any]:
    """The last chunk of a stream with ``include_usage``: no choices, the usage."""
    obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
    return {"id": rid, "object": obj, "created": created, "model": model, "system_fingerprint": system_fingerprint,
            "choices": [], "usage": usage_}


def chat_completion(rid: str, created: int, replies: list[Reply], system_fingerprint: str | None = None
                    ) -> dict[str, Any]:
    return {"id": rid, "object": "chat.completion", "created": created, "model": replies[0].model,
            "system_fingerprint": system_fingerprint,
            "choices": [{"index": i, "message": chat_message(r), "logprobs": chat_logprobs(r.logprobs),
                         "finish_reason": r.finish} for i, r in enumerate(replies)],
            "usage": reply_usage(replies)}


def completion(rid: str, created: int, replies: list[Reply], system_fingerprint: str | None = None
               ) -> dict[str, Any]:
    return {"id": rid, "object": "text_completion", "created": created, "model": replies[0].model,
            "system_fingerprint": system_fingerprint,
            "choices": [{"index": i, "text": r.content, "logprobs": completion_logprobs(r.logprobs),
                         "finish_reason": r.finish} for i, r in enumerate(replies)],
            "usage": reply_usage(replies)}
