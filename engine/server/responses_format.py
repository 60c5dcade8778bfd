"""OpenAI's Responses API (``/v1/responses``) in and out: the request becomes
the server's OpenAI-internal :class:`ParsedRequest`, a :class:`Reply` becomes a
``response`` object, and :class:`Stream` writes the typed server-sent events
(each with ``type`` and ``sequence_number``). Pure functions, no I/O. Codex
speaks this API.

Request rules:
- ``input``: a string (one user message), or items: messages ``{"role", "content"}`` (``type``
  "message" or absent; roles user, assistant, system, developer -> system; content a string or
  ``input_text`` / ``output_text`` / ``refusal`` parts), ``function_call`` items (``call_id``, ``name``,
  ``arguments``: an assistant tool call; consecutive calls join one assistant message) and
  ``function_call_output`` items (``call_id``, ``output``: a ``tool`` message). ``reasoning`` items
  (the model's earlier thoughts, which Codex sends back) are dropped. ``input_image`` parts (in a message
  or a ``function_call_output``) take ``image_url``: a data URL, or a local path or ``file://`` URL on a
  server started with ``--allow-local-images``; a remote URL and a ``file_id`` are refused, never
  fetched; each is read as the chat API's ``image_url`` parts are (``openai_format.take_image``).
  Files, audio, ``item_reference`` and other items are refused (400 naming them).
- ``instructions``: a system message first.
- ``tools``: function tools in the flat shape ``{"type": "function", "name", "description",
  "parameters", "strict"}``; any other tool type (web search, file search, computer use, local
  shell, custom/freeform tools, MCP) is refused, naming it.
- ``tool_choice``: ``auto`` | ``none`` | ``required`` | ``{"type": "function", "name"}``.
- ``text.format``: ``text``; ``json_object`` (any JSON object); ``json_schema`` (``schema``, ``name``,
  ``strict``). ``text.verbosity`` is ignored.
- ``max_output_tokens`` (default: the context size), ``temperature`` (default 1), ``top_p``
  (default 1), llama-server's ``top_k``, ``min_p``, ``seed``, penalties, and our ``speculative``.
- ``top_logprobs`` with ``include: ["message.output_text.logprobs"]``: per-token log-probabilities.
- ``store`` (default true, as OpenAI's): the response is kept in memory (the most recent 256, while
  the server runs; engine/server/response_store.py, its images with it) and ``previous_response_id``
  continues it. A
  response not kept is a 404 saying to send the whole conversation. ``conversation`` objects,
  ``background: true`` and ``prompt`` (stored prompt templates) are refused.
- Accepted and ignored: ``reasoning``, ``parallel_tool_calls``, ``metadata``, ``user``,
  ``truncation``, ``include``, ``service_tier``, ``prompt_cache_key``, ``safety_identifier``,
  ``stream_options``, ``max_tool_calls``, and **any unknown field** (Codex adds fields often).
- Model names: any ``model`` (or none) is served by the loaded model, unless ``strict_model``.

Errors use OpenAI's shape (:meth:`ApiError.body`); a stream's error is an ``error`` event and a
``response.failed`` event.
"""

from __future__ import annotations

import copy
import json
import secrets
import time
from collections.abc import Callable
from typing import Any

from engine.server.openai_format import (
    ApiError,
    ParsedRequest,
    _max_tokens,
    _sampling,
    bad,
    check_text,
    function_tool,
    speculative_from,
    take_image,
)
from engine.server.reply import Reply, TokenLogprob

ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
TEXT_PARTS = {"input_text", "output_text", "text", "refusal", "summary_text", "reasoning_text"}
LOGPROBS_INCLUDE = "message.output_text.logprobs"
STATELESS = ("previous_response_id", "conversation")
# what a response echoes of its request, with OpenAI's defaults
_ECHO_DEFAULTS: dict[str, Any] = {
    "instructions": None, "max_output_tokens": None, "metadata": {}, "parallel_tool_calls": True,
    "previous_response_id": None, "reasoning": None, "service_tier": "default", "store": False,
    "temperature": 1.0, "text": {"format": {"type": "text"}}, "tool_choice": "auto", "tools": [], "top_p": 1.0,
    "truncation": "disabled", "user": None,
}


# -- request in -------------------------------------------------------------------
def parse(body: Any, served: tuple[str, ...], n_ctx: int, *, strict_model: bool = False,
          history: Callable[[str], tuple[list[dict[str, Any]], list[str]] | None] | None = None) -> ParsedRequest:
    """A ``/v1/responses`` body. ``history`` finds the conversation a stored response ended and the sources
    of its images (``previous_response_id``; engine/server/response_store.py); without it, the request
    must carry the whole conversation. Raises :class:`ApiError` (answer it with :func:`error_body`)."""
    if not isinstance(body, dict):
        raise bad("body", "The request body must be a JSON object", "invalid_type")
    check_text(body)
    previous: list[dict[str, Any]] = []
    images: list[str] = []  # the sources of the conversation's images, in order (the kept ones first)
    for name in STATELESS:
        value = body.get(name)
        if not value:
            continue
        if name == "previous_response_id" and history is not None:
            if not isinstance(value, str):
                raise bad(name, "'previous_response_id' must be a response id", "invalid_type")
            found = history(value)
            if found is None:
                raise ApiError(404, f"Response '{value}' is not kept here: this server keeps its most recent "
                               "responses in memory only while it runs. Send the whole conversation in "
                               "'input'.", param=name, code="response_not_found")
            previous, images = found[0], list(found[1])
            continue
        kept = "conversations" if name == "conversation" else "responses"
        raise bad(name, f"'{name}' is not supported: this server keeps no {kept} here (stateless); send the whole "
                  "conversation in 'input'", "unsupported_parameter")
    if body.get("background"):
        raise bad("background", "'background' responses are not supported (the server keeps no responses)",
                  "unsupported_parameter")
    if body.get("prompt"):
        raise bad("prompt", "'prompt' (a stored prompt template) is not supported; send 'instructions' and "
                  "'input'", "unsupported_parameter")
    model = _model(body, served, strict_model)
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise bad("instructions", "'instructions' must be a string", "invalid_type")
    messages = ([{"role": "system", "content": instructions}] if instructions else []) + previous \
        + _input(body.get("input"), images)
    tools = _tools(body.get("tools"))
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise bad("stream", f"'stream' must be true or false, not {stream!r}", "invalid_type")
    return ParsedRequest(model=model, messages=messages, images=images, sampling=_sampling(body),
                         max_tokens=_max_tokens(body, n_ctx, "max_output_tokens"),
                         speculative=speculative_from(body.get("speculative")), stream=stream,
                         include_usage=stream, tools=tools or None,
                         tool_choice=_tool_choice(body.get("tool_choice"), tools),
                         json_schema=_text_format(body.get("text")), logprobs=_logprobs(body))


def _model(body: dict[str, Any], served: tuple[str, ...], strict: bool) -> str:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad("model", f"'model' must be a string naming the model, not {model!r}", "invalid_type")
    if strict and model not in served:
        raise ApiError(404, f"The model '{model}' does not exist here; this server serves {served[0]!r} "
                       "(GET /v1/models lists it)", param="model", code="model_not_found")
    return served[0]


def _parts_text(content: Any, where: str, images: list[str]) -> str:
    """A content string or parts as text: text parts joined, each ``input_image`` the worker's marker (its
    source appended to ``images``)."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if not isinstance(content, list):
        raise bad("input", f"{where} must be a string or a list of content parts", "invalid_type")
    texts = []
    for k, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in TEXT_PARTS:
            text = part.get("refusal" if kind == "refusal" else "text")
            if not isinstance(text, str):
                raise bad("input", f"{where}[{k}] must hold its text", "invalid_type")
            texts.append(text)
        elif kind == "input_image":
            if part.get("image_url") is None and part.get("file_id") is not None:
                raise bad("input", f"{where}[{k}]: images by 'file_id' are not supported (this server keeps no "
                          "files); send image_url as a data:image/…;base64 URL", "unsupported_parameter")
            texts.append(take_image(part, f"{where}[{k}]", images, "input"))
        else:
            what = f"'{kind}' parts" if isinstance(kind, str) else repr(part)[:60]
            raise bad("input", f"{where}[{k}]: {what} are not supported; this server reads text and images "
                      "(input_text / output_text / input_image)", "unsupported_parameter")
    return "".join(texts)


def _input(value: Any, images: list[str]) -> list[dict[str, Any]]:
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise bad("input", "'input' must be a string or a non-empty list of items", "invalid_type")
    out: list[dict[str, Any]] = []
    for i, item in enumerate(value):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise bad("input", f"{where} must be an object", "invalid_type")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ROLES:
                raise bad("input", f"{where}.role must be user, assistant, system or developer, not {role!r}")
            out.append({"role": ROLES[role], "content": _parts_text(item.get("content"), f"{where}.content", images)})
        elif kind == "function_call":
            call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments", "{}")
            if not isinstance(call_id, str) or not call_id or not isinstance(name, str) or not name:
                raise bad("input", f"{where}: a function_call needs a string 'call_id' and 'name'", "invalid_type")
            if not isinstance(arguments, str):
                raise bad("input", f"{where}.arguments must be JSON text", "invalid_type")
            call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":  # the message before it, or calls side by side
                last.setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id, output = item.get("call_id"), item.get("output")
            if not isinstance(call_id, str) or not call_id:
                raise bad("input", f"{where}.call_id must name the function_call it answers", "invalid_type")
            out.append({"role": "tool", "tool_call_id": call_id,
                        "content": _parts_text(output, f"{where}.output", images)})
        elif kind == "reasoning":
            continue
        elif kind == "item_reference":
            raise bad("input", f"{where}: 'item_reference' items are not supported: this server keeps no items "
                      "(send the item itself)", "unsupported_parameter")
        else:
            raise bad("input", f"{where}: '{kind}' items are not supported; this server takes messages, "
                      "function_call and function_call_output items", "unsupported_parameter")
    if not out:
        raise bad("input", "'input' holds no message")
    return out


def _tools(tools: Any) -> list[dict[str, Any]]:
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise bad("tools", "'tools' must be a list of tools", "invalid_type")
    refused = sorted({t.get("type") for t in tools if isinstance(t, dict) and t.get("type") != "function"},
                     key=str)
    if refused:
        raise bad("tools", f"tools of type {', '.join(map(repr, refused))} are not supported; this server runs "
                  "only function tools ({\"type\": \"function\", \"name\", \"parameters\"})",
                  "unsupported_parameter")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise bad("tools", f"tools[{i}] must be an object", "invalid_type")
        out.append(function_tool(f"tools[{i}]", tool.get("name"), tool.get("parameters"), tool.get("description"),
                                 tool.get("strict")))
    return out


def _tool_choice(choice: Any, tools: list[dict[str, Any]]) -> str | dict[str, Any]:
    if choice is None or choice == "auto":
        return "auto"
    if choice in ("none", "required"):
        if choice == "required" and not tools:
            raise bad("tool_choice", "'tool_choice' \"required\" needs 'tools'")
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        name = choice.get("name")
        if name not in {t["function"]["name"] for t in tools}:
            raise bad("tool_choice", f"'tool_choice' names the function {name!r}, which is not in 'tools'")
        return {"type": "function", "function": {"name": name}}
    raise bad("tool_choice", "'tool_choice' must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", "
              f"\"name\": …}}, not {choice!r}", "unsupported_parameter")


def _text_format(text: Any) -> dict[str, Any] | None:
    if text is None:
        return None
    if not isinstance(text, dict):
        raise bad("text", "'text' must be an object such as {\"format\": {\"type\": \"text\"}}", "invalid_type")
    fmt = text.get("format")
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {}
    if kind == "json_schema":
        schema = fmt.get("schema")
        if not isinstance(schema, dict):
            raise bad("text", "'text.format.schema' must be a JSON schema object", "invalid_type")
        return schema
    raise bad("text", f"'text.format.type' must be text, json_object or json_schema, not {kind!r}")


def _logprobs(body: dict[str, Any]) -> int | None:
    top, include = body.get("top_logprobs"), body.get("include") or []
    if top is not None and (isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= 20):
        raise bad("top_logprobs", f"'top_logprobs' must be an integer from 0 to 20, not {top!r}")
    if not isinstance(include, list):
        raise bad("include", "'include' must be a list of strings", "invalid_type")
    return (top or 0) if LOGPROBS_INCLUDE in include else None


# -- response out -----------------------------------------------------------------
def _id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def response_id() -> str:
    return _id("resp")


def echo(body: Any) -> dict[str, Any]:
    """What a response repeats of its request (OpenAI's defaults for what it left out): the request's
    instructions, tools, tool_choice, sampling, text format and the like. The body has passed :func:`parse`."""
    body = body if isinstance(body, dict) else {}
    out = copy.deepcopy({name: default if body.get(name) is None else body[name]
                         for name, default in _ECHO_DEFAULTS.items()})
    if isinstance(out["text"], dict) and "format" not in out["text"]:
        out["text"] = {**out["text"], "format": {"type": "text"}}
    if not out["instructions"]:
        out["instructions"] = None
    return out


def usage(reply: Reply) -> dict[str, Any]:
    return {"input_tokens": reply.prompt_tokens,
            "input_tokens_details": {"cached_tokens": min(reply.cached_tokens, reply.prompt_tokens),
                                     "cache_write_tokens": 0},
            "output_tokens": reply.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": reply.prompt_tokens + reply.completion_tokens}


def logprobs(entries: tuple[TokenLogprob, ...] | None) -> list[dict[str, Any]]:
    return [{"token": e.token, "bytes": e.bytes, "logprob": e.logprob,
             "top_logprobs": [{"token": t, "bytes": b, "logprob": lp} for t, lp, b in e.top]} for e in entries or ()]


def _text_part(text: str, entries: tuple[TokenLogprob, ...] | None = None) -> dict[str, Any]:
    part: dict[str, Any] = {"type": "output_text", "text": text, "annotations": []}
    if entries is not None:
        part["logprobs"] = logprobs(entries)
    return part


def _message_item(item_id: str, text: str, status: str, entries: tuple[TokenLogprob, ...] | None = None,
                  parts: bool = True) -> dict[str, Any]:
    return {"id": item_id, "type": "message", "status": status, "role": "assistant",
            "content": [_text_part(text, entries)] if parts else []}


def _reasoning_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    return {"id": item_id, "type": "reasoning", "summary": [], "status": status,
            "content": [{"type": "reasoning_text", "text": text}] if text else []}


def _call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {"id": item_id, "type": "function_call", "status": status, "call_id": call_id, "name": name,
            "arguments": arguments}


def status(reply: Reply) -> str:
    return "incomplete" if reply.finish == "length" else "completed"


def _envelope(rid: str, created: float, model: str, state: str, output: list[dict[str, Any]],
              request: dict[str, Any], reply: Reply | None) -> dict[str, Any]:
    body: dict[str, Any] = {"id": rid, "object": "response", "created_at": created, "status": state,
                            "background": False, "error": None,
                            "incomplete_details": {"reason": "max_output_tokens"} if state == "incomplete" else None,
                            "model": model, "output": output, **request,
                            "usage": usage(reply) if reply is not None else None}
    if state in ("completed", "incomplete"):
        body["completed_at"] = int(time.time())
    return body


def response(reply: Reply, request: Any = None, *, rid: str | None = None,
             created_at: float | None = None) -> dict[str, Any]:
    """The ``response`` object for a whole (non-streamed) reply: a reasoning item when the model thought,
    a message with its text (when there is text or no call), then one ``function_call`` item per call.
    ``request`` is the request body (for what the response echoes; see :func:`echo`)."""
    state = status(reply)
    item_status = "incomplete" if state == "incomplete" else "completed"
    output: list[dict[str, Any]] = []
    if reply.reasoning:
        output.append(_reasoning_item(_id("rs"), reply.reasoning, item_status))
    if reply.content or not reply.tool_calls:
        output.append(_message_item(_id("msg"), reply.content, item_status, reply.logprobs))
    for call in reply.tool_calls:
        output.append(_call_item(_id("fc"), call.id, call.name, call.arguments, "completed"))
    return _envelope(rid or response_id(), created_at if created_at is not None else int(time.time()), reply.model,
                     state, output, echo(request), reply)


def error_body(err: ApiError) -> dict[str, Any]:
    """OpenAI's error shape, as the chat endpoints answer."""
    return err.body()


# -- streaming out ------------------------------------------------------------------
def sse(data: dict[str, Any]) -> str:
    return f"event: {data['type']}\ndata: {json.dumps(data, ensure_ascii=False, separators=(',', ':'))}\n\n"


def _failure_code(status_: int) -> str:
    return "rate_limit_exceeded" if status_ == 429 else "invalid_prompt" if 400 <= status_ < 500 else "server_error"


class Stream:
    """A reply's progress as Responses events: ``response.created`` and ``response.in_progress``; an output
    item per part of the reply (a reasoning item, the message with its text part, each function call with
    its arguments), each ``added`` then ``done``; and ``response.completed`` (``response.incomplete`` when
    max_output_tokens cut it short) carrying the whole response. Each method returns the events to write.
    """

    def __init__(self, model: str, request: Any = None, *, rid: str | None = None,
                 created_at: float | None = None) -> None:
        self.model, self.request = model, echo(request)
        self.id = rid or response_id()
        self.created = created_at if created_at is not None else int(time.time())
        self.seq = 0
        self.output: list[dict[str, Any]] = []  # the items done so far
        self.open: dict[str, Any] | None = None  # the item being streamed
        self.sent_text = ""
        self.sent_reasoning = ""
        self.started = self.finished = False

    def _event(self, type_: str, **fields: Any) -> str:
        data = {"type": type_, "sequence_number": self.seq, **fields}
        self.seq += 1
        return sse(data)

    def _response(self, state: str, reply: Reply | None = None) -> dict[str, Any]:
        return _envelope(self.id, self.created, self.model, state, list(self.output), self.request, reply)

    def start(self) -> list[str]:
        self.started = True
        return [self._event("response.created", response=self._response("in_progress")),
                self._event("response.in_progress", response=self._response("in_progress"))]

    def _open_item(self, kind: str) -> list[str]:
        if self.open is not None and self.open["type"] == kind:
            return []
        out = [] if self.started else self.start()
        out += self._close_item("completed")
        index = len(self.output)
        if kind == "message":
            item = _message_item(_id("msg"), "", "in_progress", parts=False)
            out.append(self._event("response.output_item.added", output_index=index, item=item))
            out.append(self._event("response.content_part.added", item_id=item["id"], output_index=index,
                                   content_index=0, part=_text_part("")))
        else:
            item = _reasoning_item(_id("rs"), "", "in_progress")
            out.append(self._event("response.output_item.added", output_index=index, item=item))
        self.open = {"type": kind, "item": item, "index": index, "text": ""}
        return out

    def _close_item(self, item_status: str, entries: tuple[TokenLogprob, ...] | None = None) -> list[str]:
        if self.open is None:
            return []
        item, index, text = self.open["item"], self.open["index"], self.open["text"]
        out = []
        if self.open["type"] == "message":
            part = _text_part(text, entries)
            out.append(self._event("response.output_text.done", item_id=item["id"], output_index=index,
                                   content_index=0, text=text, logprobs=_delta_logprobs(entries)))
            out.append(self._event("response.content_part.done", item_id=item["id"], output_index=index,
                                   content_index=0, part=part))
            done = {**item, "status": item_status, "content": [part]}
        else:
            out.append(self._event("response.reasoning_text.done", item_id=item["id"], output_index=index,
                                   content_index=0, text=text))
            done = _reasoning_item(item["id"], text, item_status)
        out.append(self._event("response.output_item.done", output_index=index, item=done))
        self.output.append(done)
        self.open = None
        return out

    def text(self, delta: str) -> list[str]:
        if not delta:
            return []
        out = self._open_item("message")
        assert self.open is not None
        self.open["text"] += delta
        self.sent_text += delta
        out.append(self._event("response.output_text.delta", item_id=self.open["item"]["id"],
                               output_index=self.open["index"], content_index=0, delta=delta, logprobs=[]))
        return out

    def reasoning(self, delta: str) -> list[str]:
        """A piece of the model's thinking (a ``reasoning`` item before the message)."""
        if not delta:
            return []
        out = self._open_item("reasoning")
        assert self.open is not None
        if not self.open["text"]:
            out.append(self._event("response.content_part.added", item_id=self.open["item"]["id"],
                                   output_index=self.open["index"], content_index=0,
                                   part={"type": "reasoning_text", "text": ""}))
        self.open["text"] += delta
        self.sent_reasoning += delta
        out.append(self._event("response.reasoning_text.delta", item_id=self.open["item"]["id"],
                               output_index=self.open["index"], content_index=0, delta=delta))
        return out

    def finish(self, reply: Reply) -> list[str]:
        """The rest: text (and thinking) the deltas have not carried yet, when they were a prefix of the
        reply's, each function call as an item, and ``response.completed`` (or ``.incomplete``)."""
        out = [] if self.started else self.start()
        if reply.reasoning.startswith(self.sent_reasoning) and reply.reasoning != self.sent_reasoning \
                and not self.sent_text:
            out += self.reasoning(reply.reasoning[len(self.sent_reasoning):])
        if reply.content.startswith(self.sent_text) and reply.content != self.sent_text:
            out += self.text(reply.content[len(self.sent_text):])
        if not self.output and self.open is None and not reply.tool_calls:  # an empty reply: an empty message
            out += self._open_item("message")
        state = status(reply)
        item_status = "incomplete" if state == "incomplete" else "completed"
        entries = reply.logprobs if self.open is not None and self.open["type"] == "message" else None
        out += self._close_item(item_status, entries)
        for call in reply.tool_calls:
            index = len(self.output)
            item = _call_item(_id("fc"), call.id, call.name, "", "in_progress")
            out.append(self._event("response.output_item.added", output_index=index, item=item))
            out.append(self._event("response.function_call_arguments.delta", item_id=item["id"],
                                   output_index=index, delta=call.arguments))
            out.append(self._event("response.function_call_arguments.done", item_id=item["id"],
                                   output_index=index, arguments=call.arguments, name=call.name))
            done = {**item, "arguments": call.arguments, "status": "completed"}
            out.append(self._event("response.output_item.done", output_index=index, item=done))
            self.output.append(done)
        kind = "response.incomplete" if state == "incomplete" else "response.completed"
        out.append(self._event(kind, response=self._response(state, reply)))
        self.finished = True
        return out

    def error(self, err: ApiError) -> list[str]:
        """An error once the stream has begun: an ``error`` event, then ``response.failed``."""
        out = [] if self.started else self.start()
        out.append(self._event("error", code=err.code, message=err.message, param=err.param))
        failed = self._response("failed")
        failed["error"] = {"code": _failure_code(err.status), "message": err.message}
        out.append(self._event("response.failed", response=failed))
        self.finished = True
        return out


def _delta_logprobs(entries: tuple[TokenLogprob, ...] | None) -> list[dict[str, Any]]:
    """Logprobs as the text events carry them (no bytes)."""
    return [{"token": e.token, "logprob": e.logprob,
             "top_logprobs": [{"token": t, "logprob": lp} for t, lp, _ in e.top]} for e in entries or ()]
