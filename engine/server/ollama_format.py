"""Ollama's native API (``/api/chat``, ``/api/generate``, ``/api/tags``, ``/api/show``, ``/api/ps``,
``/api/version``) in and out: requests become the server's OpenAI-internal
:class:`ParsedRequest`, a :class:`Reply` becomes Ollama's answer, and
:class:`Stream` writes Ollama's NDJSON (one JSON object per line). Pure
functions, no I/O. VS Code Copilot and Open WebUI speak this API.

Request rules:
- ``stream`` defaults to **true**, as in Ollama.
- ``/api/chat`` ``messages``: roles system / user / assistant / tool; ``content`` a string; an
  assistant's ``tool_calls`` (``function.arguments`` an object, or JSON text) become OpenAI tool calls
  with stable ids (``call_<message>_<call>`` unless the client sent ``id``s, so a conversation renders
  the same prompt every turn and the engine's prefix cache holds); a ``tool`` message is paired with
  its call by ``tool_call_id``, else by ``tool_name``, else with the oldest unanswered call.
  ``images`` (base64, as Ollama's clients send them) go where Ollama puts them: each in place of the
  first ``[img]`` left in the content, else before it; ``thinking`` is dropped.
- ``/api/generate``: ``prompt`` and ``system`` go through the chat template (as two messages);
  ``raw: true`` sends the prompt as it is. ``images`` go into the prompt as in a chat message.
  ``suffix`` (fill in the middle), ``template`` and ``context`` are refused. No ``prompt`` (and, for
  chat, no ``messages``) is Ollama's load check: the parser returns a :class:`LoadCheck`, answered by
  :func:`load_body` (``done_reason: "load"``, or ``"unload"`` with ``keep_alive: 0``).
- Images are read as the OpenAI API's ``image_url`` parts are (``openai_format.take_source``, each a
  data URL); a model without a vision projector refuses them (400).
- ``format``: ``"json"`` -> any JSON object; a schema object -> JSON of that schema; ``""`` -> none.
- ``options``: ``temperature``, ``top_p``, ``top_k``, ``min_p``, ``seed`` (negative: random),
  ``num_predict`` (-1, -2, 0 or missing: up to the context size), ``stop``, ``repeat_penalty``,
  ``repeat_last_n``, ``presence_penalty``, ``frequency_penalty``. Defaults are Ollama's
  (:data:`DEFAULTS`: temperature 0.8, top_k 40, top_p 0.9, repeat_penalty 1.1 over the last 64 tokens).
  Every other option (``num_ctx``, ``num_gpu``, ``num_thread``, ``mirostat``, …) is accepted and
  ignored, as Ollama ignores options its runner does not use.
- ``tools`` are OpenAI-shaped already (``{"type": "function", "function": {…}}``).
- ``logprobs`` / ``top_logprobs``: the chosen tokens' log-probabilities (and k alternatives).
- ``think: false`` sets the template's ``enable_thinking`` to false (Qwen3's templates read it); the text
  of a thinking block comes back as ``thinking``.
- ``keep_alive``, ``truncate``, ``shift``, ``speculative`` (our extension) and unknown fields are
  accepted and ignored (``speculative`` is used).
- Model names: any ``model`` is served by the loaded model, unless ``strict_model`` (then an unknown
  one is 404 ``model '…' not found``, Ollama's words; ``name:latest`` matches ``name``).

Errors are ``{"error": "message"}``; once a stream has begun, the error is one more line of that shape.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from engine.generation.image_sources import data_url
from engine.sampling import MAX_SEED, RANDOM_SEED, SamplingParams
from engine.server.openai_format import (
    ApiError,
    ParsedRequest,
    _sampling,
    bad,
    check_text,
    function_tools,
    speculative_from,
    stop_strings,
    take_source,
)
from engine.server.reply import Reply, TokenLogprob, arguments_object

OLLAMA_VERSION = "0.13.0"  # the Ollama API level answered by /api/version (clients gate features on it)
# Ollama's own defaults (api/types.go DefaultOptions), for a request that leaves an option out
DEFAULTS = SamplingParams(temperature=0.8, top_k=40, top_p=0.9, min_p=0.0, repeat_penalty=1.1, repeat_last_n=64)
ROLES = ("system", "user", "assistant", "tool")
DONE_REASONS = {"stop": "stop", "length": "length", "tool_calls": "stop", "cancelled": "stop"}
CAPABILITIES = ("completion", "tools")


@dataclass(frozen=True)
class LoadCheck:
    """A chat without messages or a generate without a prompt: Ollama's "load the model" call
    (``unload``: ``keep_alive`` 0, "unload it"). Answered by :func:`load_body`, nothing generated."""

    model: str
    chat: bool
    unload: bool = False


# -- request in -------------------------------------------------------------------
def parse_chat(body: Any, served: tuple[str, ...], n_ctx: int, *,
               strict_model: bool = False) -> ParsedRequest | LoadCheck:
    """An ``/api/chat`` body. Raises :class:`ApiError` (answer it with :func:`error_body`)."""
    body = _object(body)
    model = _model(body, served, strict_model)
    messages = body.get("messages")
    if messages is None or messages == []:
        return LoadCheck(model, chat=True, unload=_unload(body))
    tools = _tools(body.get("tools"))
    images: list[str] = []
    return _request(body, model, n_ctx, messages=_messages(messages, images), tools=tools, images=images)


def parse_generate(body: Any, served: tuple[str, ...], n_ctx: int, *,
                   strict_model: bool = False) -> ParsedRequest | LoadCheck:
    """An ``/api/generate`` body. Raises :class:`ApiError` (answer it with :func:`error_body`)."""
    body = _object(body)
    model = _model(body, served, strict_model)
    for name in ("suffix", "template"):
        if body.get(name):
            what = "fill-in-the-middle" if name == "suffix" else "a custom prompt template"
            raise bad(name, f"'{name}' ({what}) is not supported by this server", "unsupported_parameter")
    if body.get("context"):
        raise bad("context", "'context' (the token context of an earlier answer) is not supported; send the "
                  "conversation to /api/chat instead", "unsupported_parameter")
    prompt, system, raw = body.get("prompt"), body.get("system"), body.get("raw", False)
    if prompt is not None and not isinstance(prompt, str):
        raise bad("prompt", f"'prompt' must be a string, not {prompt!r}", "invalid_type")
    if system is not None and not isinstance(system, str):
        raise bad("system", f"'system' must be a string, not {system!r}", "invalid_type")
    if raw not in (True, False, None):
        raise bad("raw", f"'raw' must be true or false, not {raw!r}", "invalid_type")
    images: list[str] = []
    prompt = _with_images(prompt or "", body.get("images"), "images", "images", images)
    if not prompt:
        return LoadCheck(model, chat=False, unload=_unload(body))
    if raw:
        return _request(body, model, n_ctx, prompt=prompt, images=images)
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    return _request(body, model, n_ctx, messages=messages, images=images)


def parse_show(body: Any, served: tuple[str, ...], *, strict_model: bool = False) -> str:
    """An ``/api/show`` body (``model``, or the older ``name``): the served model it asks about."""
    body = _object(body)
    if "model" not in body and "name" in body:
        body = {**body, "model": body["name"]}
    return _model(body, served, strict_model)


def _object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise bad("body", "The request body must be a JSON object", "invalid_type")
    check_text(body)
    return body


def _unload(body: dict[str, Any]) -> bool:
    return body.get("keep_alive") in (0, "0", "0s", "0m")


def _model(body: dict[str, Any], served: tuple[str, ...], strict: bool) -> str:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad("model", f"'model' must be a string naming the model, not {model!r}", "invalid_type")
    if strict and model not in served and (model or "").removesuffix(":latest") not in served:
        raise ApiError(404, f"model '{model}' not found", param="model", code="model_not_found")
    return served[0]


def _request(body: dict[str, Any], model: str, n_ctx: int, *, prompt: str | None = None,
             messages: list[dict[str, Any]] | None = None,
             tools: list[dict[str, Any]] | None = None, images: list[str] | None = None) -> ParsedRequest:
    options = body.get("options") or {}
    if not isinstance(options, dict):
        raise bad("options", "'options' must be an object", "invalid_type")
    stream = body.get("stream", True)
    if stream is None:
        stream = True
    if not isinstance(stream, bool):
        raise bad("stream", f"'stream' must be true or false, not {stream!r}", "invalid_type")
    return ParsedRequest(model=model, prompt=prompt, messages=messages, images=images or [],
                         sampling=_sampling_options(options),
                         max_tokens=_num_predict(options, n_ctx), stop=_stop(options),
                         speculative=speculative_from(body.get("speculative")), stream=stream,
                         include_usage=stream, tools=tools or None, json_schema=_format(body.get("format")),
                         logprobs=_logprobs(body),
                         # think: false asks a thinking model not to think (Qwen3's templates read enable_thinking)
                         template_kwargs={"enable_thinking": False} if body.get("think") is False else None)


def _sampling_options(options: dict[str, Any]) -> SamplingParams:
    values = dict(options)  # the sampling fields among them; a null one takes Ollama's default
    seed = values.get("seed")
    if isinstance(seed, int) and not isinstance(seed, bool) and (seed < 0 or seed > MAX_SEED):
        values["seed"] = RANDOM_SEED if seed < 0 else seed & MAX_SEED  # Ollama: -1 random; a wide seed wraps
    try:
        return _sampling(values, DEFAULTS)
    except ApiError as err:
        raise bad(f"options.{err.param}", f"options: {err.message}", err.code or "invalid_value") from None


def _num_predict(options: dict[str, Any], n_ctx: int) -> int:
    value = options.get("num_predict")
    if value is None:
        return n_ctx
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad("options.num_predict", f"options.num_predict must be an integer, not {value!r}", "invalid_type")
    return value if value > 0 else n_ctx  # -1 "no limit" and -2 "fill the context" both end at the context


def _stop(options: dict[str, Any]) -> list[str]:
    return stop_strings(options.get("stop"), "options.stop")


def _format(value: Any) -> dict[str, Any] | None:
    if value is None or value == "":
        return None
    if value == "json":
        return {}
    if isinstance(value, dict):
        return value
    raise bad("format", f"'format' must be \"json\" or a JSON schema object, not {value!r}", "invalid_type")


def _logprobs(body: dict[str, Any]) -> int | None:
    wanted, top = body.get("logprobs"), body.get("top_logprobs")
    if wanted not in (True, False, None):
        raise bad("logprobs", f"'logprobs' must be true or false, not {wanted!r}", "invalid_type")
    if top is not None and (isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= 20):
        raise bad("top_logprobs", f"'top_logprobs' must be an integer from 0 to 20, not {top!r}")
    return (top or 0) if wanted else None


def _tools(tools: Any) -> list[dict[str, Any]]:
    return [] if tools is None else function_tools(tools)


def _arguments_text(arguments: Any, where: str) -> str:
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            raise bad("messages", f"{where}.arguments must be an object (or its JSON text)", "invalid_type") from None
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise bad("messages", f"{where}.arguments must be an object", "invalid_type")
    return json.dumps(arguments, ensure_ascii=False)


def _with_images(text: str, value: Any, where: str, param: str, images: list[str]) -> str:
    """``text`` with the worker's marker for each of ``value``'s images where Ollama puts an image: in place
    of the first ``[img]`` left, else before the text (in order); their sources appended to ``images``."""
    if value is None or value == []:
        return text
    if not isinstance(value, list):
        raise bad(param, f"{where} must be a list of base64-encoded images", "invalid_type")
    before = []
    for k, image in enumerate(value):
        if not isinstance(image, str) or not image:
            raise bad(param, f"{where}[{k}] must be a base64-encoded image", "invalid_type")
        source = image if image.startswith("data:") else data_url(image, "image/*")
        marker = take_source(source, f"{where}[{k}]", images, param)
        if "[img]" in text:
            text = text.replace("[img]", marker, 1)
        else:
            before.append(marker)
    return "".join(before) + text


def _messages(messages: Any, images: list[str]) -> list[dict[str, Any]]:
    if not isinstance(messages, list):
        raise bad("messages", "'messages' must be a list of {role, content} objects", "invalid_type")
    out: list[dict[str, Any]] = []
    pending: list[tuple[str, str]] = []  # (call id, name) asked and not yet answered, oldest first
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise bad("messages", f"{where} must be an object", "invalid_type")
        role, content = message.get("role"), message.get("content")
        if role not in ROLES:
            raise bad("messages", f"{where}.role must be one of {list(ROLES)}, not {role!r}")
        if content is None:
            content = ""
        if not isinstance(content, str):
            raise bad("messages", f"{where}.content must be a string", "invalid_type")
        content = _with_images(content, message.get("images"), f"{where}.images", "messages", images)
        entry: dict[str, Any] = {"role": role, "content": content}
        if role == "assistant" and message.get("tool_calls"):
            entry["tool_calls"] = _tool_calls(message["tool_calls"], i, where, pending)
        elif role == "tool":
            entry["tool_call_id"] = _answered(message, pending, where)
        out.append(entry)
    return out


def _tool_calls(calls: Any, i: int, where: str, pending: list[tuple[str, str]]) -> list[dict[str, Any]]:
    if not isinstance(calls, list):
        raise bad("messages", f"{where}.tool_calls must be a list", "invalid_type")
    out = []
    for j, call in enumerate(calls):
        at = f"{where}.tool_calls[{j}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
            raise bad("messages", f"{at} must be {{\"function\": {{\"name\", \"arguments\"}}}}", "invalid_type")
        call_id = call.get("id")
        if not isinstance(call_id, str) or not call_id:
            call_id = f"call_{i}_{j}"
        pending.append((call_id, function["name"]))
        out.append({"id": call_id, "type": "function",
                    "function": {"name": function["name"],
                                 "arguments": _arguments_text(function.get("arguments"), f"{at}.function")}})
    return out


def _answered(message: dict[str, Any], pending: list[tuple[str, str]], where: str) -> str:
    """The id of the call a tool message answers: its ``tool_call_id``, else the oldest unanswered call of its
    ``tool_name``, else the oldest unanswered call."""
    given, name = message.get("tool_call_id"), message.get("tool_name") or message.get("name")
    for k, (call_id, call_name) in enumerate(pending):
        if (given and call_id == given) or (not given and name and call_name == name):
            del pending[k]
            return call_id
    if isinstance(given, str) and given:
        return given
    if pending:
        return pending.pop(0)[0]
    raise bad("messages", f"{where}: a tool message must follow an assistant message with tool_calls")


# -- response out -----------------------------------------------------------------
def created_at(when: float | None = None) -> str:
    """RFC 3339 in UTC with microseconds, as Ollama writes it (``2025-01-02T03:04:05.123456Z``)."""
    moment = datetime.fromtimestamp(time.time() if when is None else when, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def tool_calls(reply: Reply) -> list[dict[str, Any]]:
    return [{"id": call.id, "function": {"index": k, "name": call.name, "arguments": arguments_object(call.arguments)}}
            for k, call in enumerate(reply.tool_calls)]


def _ns(ms: Any) -> int:
    return int(round(ms * 1e6)) if isinstance(ms, int | float) and ms > 0 else 0


def counts(reply: Reply, total_s: float | None = None) -> dict[str, Any]:
    """The final object's counts and durations (nanoseconds) from ``reply.extras["timings"]``.
    ``prompt_eval_count`` is the whole prompt (cached tokens too), so a client can track the context."""
    timings = reply.extras.get("timings") or {}
    prompt_ns, eval_ns = _ns(timings.get("prompt_ms")), _ns(timings.get("predicted_ms"))
    total_ns = int(total_s * 1e9) if total_s is not None else prompt_ns + eval_ns
    return {"done_reason": DONE_REASONS.get(reply.finish, "stop"), "total_duration": max(total_ns, prompt_ns + eval_ns),
            "load_duration": 0, "prompt_eval_count": reply.prompt_tokens, "prompt_eval_duration": prompt_ns,
            "eval_count": reply.completion_tokens, "eval_duration": eval_ns}


def logprobs(entries: tuple[TokenLogprob, ...] | None) -> list[dict[str, Any]] | None:
    if entries is None:
        return None
    return [{"token": e.token, "logprob": e.logprob, "bytes": e.bytes,
             "top_logprobs": [{"token": t, "logprob": lp, "bytes": b} for t, lp, b in e.top]} for e in entries]


def _message(reply: Reply, content: str) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reply.reasoning:
        message["thinking"] = reply.reasoning
    if reply.tool_calls:
        message["tool_calls"] = tool_calls(reply)
    return message


def chat_response(reply: Reply, *, total_s: float | None = None, when: float | None = None) -> dict[str, Any]:
    """The whole (``stream: false``) ``/api/chat`` answer."""
    body = {"model": reply.model, "created_at": created_at(when), "message": _message(reply, reply.content),
            "done": True, **counts(reply, total_s)}
    if reply.logprobs is not None:
        body["logprobs"] = logprobs(reply.logprobs)
    return body


def generate_response(reply: Reply, *, total_s: float | None = None, when: float | None = None) -> dict[str, Any]:
    """The whole (``stream: false``) ``/api/generate`` answer."""
    body: dict[str, Any] = {"model": reply.model, "created_at": created_at(when), "response": reply.content}
    if reply.reasoning:
        body["thinking"] = reply.reasoning
    body.update(done=True, **counts(reply, total_s))
    if reply.logprobs is not None:
        body["logprobs"] = logprobs(reply.logprobs)
    return body


def response(reply: Reply, *, chat: bool = True, total_s: float | None = None) -> dict[str, Any]:
    """:func:`chat_response` or :func:`generate_response`."""
    return chat_response(reply, total_s=total_s) if chat else generate_response(reply, total_s=total_s)


def load_body(check: LoadCheck, *, when: float | None = None) -> dict[str, Any]:
    """The answer to a load (or unload) check: ``done`` with ``done_reason`` "load" / "unload"."""
    body: dict[str, Any] = {"model": check.model, "created_at": created_at(when)}
    if check.chat:
        body["message"] = {"role": "assistant", "content": ""}
    else:
        body["response"] = ""
    body.update(done=True, done_reason="unload" if check.unload else "load")
    return body


def error_body(err: ApiError) -> dict[str, str]:
    return {"error": err.message}


# -- model facts ----------------------------------------------------------------------
def parameter_size(n_params: int | None) -> str:
    """Ollama's way of writing a parameter count: ``7.6B``, ``268.1M``."""
    if not n_params:
        return ""
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n_params >= scale:
            return f"{n_params / scale:.1f}{suffix}"
    return str(n_params)


def details(architecture: str, n_params: int | None, quantization: str | None) -> dict[str, Any]:
    """Ollama's ``details`` object (``ModelDetails``)."""
    return {"parent_model": "", "format": "gguf", "family": architecture, "families": [architecture],
            "parameter_size": parameter_size(n_params), "quantization_level": quantization or ""}


def digest(path: str, size: int, modified: float) -> str:
    """A stable stand-in for Ollama's manifest digest: the file's path, size and time hashed (no file read)."""
    return hashlib.sha256(f"{path}\0{size}\0{modified}".encode("utf-8", "backslashreplace")).hexdigest()


def _rfc3339(when: float) -> str:
    return datetime.fromtimestamp(when, UTC).isoformat().replace("+00:00", "Z")


def tags_body(name: str, *, path: str, size: int, modified: float, architecture: str, n_params: int | None,
              quantization: str | None) -> dict[str, Any]:
    """``/api/tags``: the loaded model (the only one served), named as the other APIs name it."""
    return {"models": [{"name": name, "model": name, "modified_at": _rfc3339(modified), "size": size,
                        "digest": digest(path, size, modified),
                        "details": details(architecture, n_params, quantization)}]}


def ps_body(name: str, *, path: str, size: int, modified: float, architecture: str, n_params: int | None,
            quantization: str | None, n_ctx: int, size_vram: int = 0,
            expires_at: float | None = None) -> dict[str, Any]:
    """``/api/ps``: the model in memory."""
    until = expires_at if expires_at is not None else time.time() + 365 * 86400  # loaded until the server stops
    return {"models": [{"name": name, "model": name, "size": size, "digest": digest(path, size, modified),
                        "details": details(architecture, n_params, quantization), "expires_at": _rfc3339(until),
                        "size_vram": size_vram, "context_length": n_ctx}]}


def show_body(*, architecture: str, n_ctx: int, n_params: int | None, quantization: str | None,
              modified: float, template: str | None = None,
              capabilities: tuple[str, ...] = CAPABILITIES, parameters: dict[str, Any] | None = None) -> dict[str, Any]:
    """``/api/show``: details, ``model_info`` with ``general.architecture`` and ``<arch>.context_length``
    (Copilot reads the context size there), and ``capabilities`` (``tools`` lets agents offer tool use)."""
    info: dict[str, Any] = {"general.architecture": architecture, f"{architecture}.context_length": n_ctx}
    if n_params:
        info["general.parameter_count"] = n_params
    params = {"num_ctx": n_ctx, **(parameters or {})}
    return {"license": "", "modelfile": "", "parameters": "\n".join(f"{k} {v}" for k, v in params.items()),
            "template": template or "", "details": details(architecture, n_params, quantization),
            "model_info": info, "capabilities": list(capabilities), "modified_at": _rfc3339(modified)}


def version_body() -> dict[str, str]:
    return {"version": OLLAMA_VERSION}


# -- streaming out ------------------------------------------------------------------
def line(obj: dict[str, Any]) -> str:
    """One NDJSON line."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n"


class Stream:
    """A reply's progress as Ollama's NDJSON: a line per text delta (``done: false``), then a final line
    with ``done: true``, the counts and (in ``/api/chat``) the tool calls. The media type is
    ``application/x-ndjson``. Each method returns the lines to write."""

    def __init__(self, model: str, *, chat: bool = True) -> None:
        self.model, self.chat = model, chat
        self.sent_text = ""
        self.sent_reasoning = ""
        self.finished = False

    def start(self) -> list[str]:
        return []  # Ollama sends nothing before the first piece of text

    def _piece(self, content: str = "", thinking: str = "") -> dict[str, Any]:
        obj: dict[str, Any] = {"model": self.model, "created_at": created_at()}
        if self.chat:
            message: dict[str, Any] = {"role": "assistant", "content": content}
            if thinking:
                message["thinking"] = thinking
            obj["message"] = message
        else:
            obj["response"] = content
            if thinking:
                obj["thinking"] = thinking
        obj["done"] = False
        return obj

    def text(self, delta: str) -> list[str]:
        if not delta:
            return []
        self.sent_text += delta
        return [line(self._piece(content=delta))]

    def reasoning(self, delta: str) -> list[str]:
        if not delta:
            return []
        self.sent_reasoning += delta
        return [line(self._piece(thinking=delta))]

    def finish(self, reply: Reply, *, total_s: float | None = None) -> list[str]:
        """The rest: text (and thinking) the deltas have not carried yet, when they were a prefix of the
        reply's, and the final ``done`` line with the counts and the tool calls."""
        out = []
        if reply.reasoning.startswith(self.sent_reasoning) and reply.reasoning != self.sent_reasoning \
                and not self.sent_text:
            out += self.reasoning(reply.reasoning[len(self.sent_reasoning):])
        if reply.content.startswith(self.sent_text) and reply.content != self.sent_text:
            out += self.text(reply.content[len(self.sent_text):])
        last = self._piece()
        if self.chat and reply.tool_calls:
            last["message"]["tool_calls"] = tool_calls(reply)
        if reply.logprobs is not None:
            last["logprobs"] = logprobs(reply.logprobs)
        last.update(done=True, **counts(reply, total_s))
        out.append(line(last))
        self.finished = True
        return out

    def error(self, err: ApiError) -> list[str]:
        self.finished = True
        return [line(error_body(err))]
