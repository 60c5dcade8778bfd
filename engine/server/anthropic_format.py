"""Anthropic Messages (``/v1/messages``, ``/v1/messages/count_tokens``) in and out:
the request becomes the server's OpenAI-internal :class:`ParsedRequest`, a
:class:`Reply` becomes a ``message`` object, and :class:`Stream` turns a
generation's progress into Anthropic's server-sent events. Pure functions, no
I/O, so every rule is testable alone. Claude Code speaks this API.

Request rules:
- ``system``: a string or a list of text blocks; it becomes the first message (role ``system``).
- ``messages``: ``user`` / ``assistant`` turns; content a string or blocks. ``text`` blocks are joined;
  ``tool_use`` (assistant) becomes an OpenAI ``tool_calls`` entry (arguments as JSON text);
  ``tool_result`` (user) becomes a ``{"role": "tool", "tool_call_id", "content"}`` message, its
  content a string or text blocks, ``is_error`` prefixing the text with ``"Error: "``;
  ``thinking`` and ``redacted_thinking`` blocks are dropped (the model's own earlier reasoning);
  ``image`` blocks (in a user turn or a tool_result) take a ``base64`` source or a ``url`` source (a data
  URL; a local path or ``file://`` URL on a server started with ``--allow-local-images``; a remote URL
  is refused, never fetched), read as the OpenAI API's ``image_url`` parts are
  (``openai_format.take_source``); ``document``, ``file`` sources and any other block type are refused
  (400 naming the block).
- ``max_tokens``: Anthropic requires it; missing means the context size.
- ``stop_sequences`` (up to 16), ``temperature`` (default 1.0, Anthropic's), ``top_p``, ``top_k``
  (default off); llama-server's ``min_p``, ``seed``, penalties and our ``speculative`` extension are
  accepted too (``extra_body`` with the official client).
- ``tools``: custom tools ``{name, description, input_schema}``; server tools (``web_search_…``,
  ``bash_…``, ``text_editor_…``: any ``type`` but ``custom``) are refused, this server runs none.
- ``tool_choice``: ``auto`` -> auto, ``any`` -> required, ``tool`` -> that function, ``none`` -> none.
  ``disable_parallel_tool_use`` is accepted without effect.
- ``output_config.format`` / ``output_format`` ``{"type": "json_schema", "schema": …}``: the reply is
  JSON of that schema.
- Model names: any ``model`` (or none) is served by the loaded model, unless ``strict_model``.

Accepted and ignored (they cannot change the text here, and Anthropic clients add new fields often,
so **any unknown field is accepted and ignored** too): ``metadata``, ``stream`` options,
``thinking``, ``service_tier``, ``cache_control``, ``container``, ``context_management``,
``mcp_servers``, ``inference_geo``, ``speed``, ``diagnostics``, ``output_config.effort``,
``betas``, ``user_profile_id``, ``workspace_id``, and ``cache_control`` / ``citations`` on blocks.

Usage figures follow Anthropic: ``input_tokens`` excludes the prompt tokens read from the engine's
cache, which are ``cache_read_input_tokens`` (the two add up to the prompt).
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from engine.generation.image_sources import data_url
from engine.server.openai_format import (
    ApiError,
    ParsedRequest,
    _max_tokens,
    _sampling,
    bad,
    check_text,
    function_tool,
    speculative_from,
    take_source,
)
from engine.server.reply import Reply, arguments_object

MAX_STOP_SEQUENCES = 16
ERROR_PREFIX = "Error: "  # a tool_result with is_error: true reaches the model as this + its text
_DROPPED_BLOCKS = {"thinking", "redacted_thinking"}
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "cancelled": "end_turn"}
# Anthropic's error types by HTTP status (https://docs.anthropic.com/en/api/errors)
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
               503: "overloaded_error", 504: "timeout_error", 529: "overloaded_error"}


# -- request in -------------------------------------------------------------------
def parse(body: Any, served: tuple[str, ...], n_ctx: int, *, strict_model: bool = False) -> ParsedRequest:
    """A ``/v1/messages`` body (or ``/v1/messages/count_tokens``: ``max_tokens`` may be left out),
    every used field checked. Raises :class:`ApiError` (answer it with :func:`error_body`)."""
    if not isinstance(body, dict):
        raise bad("body", "The request body must be a JSON object", "invalid_type")
    check_text(body)
    model = _model(body, served, strict_model)
    images: list[str] = []  # the sources of the messages' image blocks, in order
    messages = _system(body.get("system")) + _messages(body.get("messages"), images)
    tools = _tools(body.get("tools"))
    tool_choice = _tool_choice(body.get("tool_choice"), tools)
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise bad("stream", f"'stream' must be true or false, not {stream!r}", "invalid_type")
    return ParsedRequest(model=model, messages=messages, images=images, sampling=_sampling(body),
                         max_tokens=_max_tokens(body, n_ctx, "max_tokens"), stop=_stop_sequences(body),
                         speculative=speculative_from(body.get("speculative")), stream=stream,
                         include_usage=stream, tools=tools or None, tool_choice=tool_choice,
                         json_schema=_output_schema(body))


def _model(body: dict[str, Any], served: tuple[str, ...], strict: bool) -> str:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad("model", f"'model' must be a string naming the model, not {model!r}", "invalid_type")
    if strict and model not in served:
        raise ApiError(404, f"model: '{model}' is not served here; this server serves {served[0]!r}",
                       param="model", code="model_not_found", type_="not_found_error")
    return served[0]


def _text_blocks(value: Any, where: str, param: str, images: list[str] | None = None) -> str:
    """A string, or a list of text blocks joined (``cache_control`` and ``citations`` ignored); with
    ``images``, image blocks too (each one's marker in the text, its source appended to ``images``)."""
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    if not isinstance(value, list):
        raise bad(param, f"{where} must be a string or a list of text blocks", "invalid_type")
    parts = []
    for i, block in enumerate(value):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "image" and images is not None:
            parts.append(_image(block, f"{where}[{i}]", images))
            continue
        if kind != "text" or not isinstance(block.get("text"), str):
            what = "text and image" if images is not None else "text"
            raise bad(param, f"{where}[{i}]: only {what} blocks are supported here, not {_kind(block)}",
                      "unsupported_parameter")
        parts.append(block["text"])
    return "\n".join(parts) if param == "system" else "".join(parts)


def _kind(block: Any) -> str:
    if isinstance(block, dict) and isinstance(block.get("type"), str):
        kind = block["type"]
        if kind == "document":
            return "'document' blocks (this server reads text and images only)"
        return f"'{kind}' blocks"
    return repr(block)[:60]


def _image(block: dict[str, Any], where: str, images: list[str]) -> str:
    """An ``image`` block's marker; its source (base64 as a data URL, or the ``url``) appended to ``images``."""
    source = block.get("source")
    kind = source.get("type") if isinstance(source, dict) else None
    if kind == "base64":
        media_type, payload = source.get("media_type", "image/png"), source.get("data")
        if not isinstance(payload, str) or not payload or not isinstance(media_type, str):
            raise bad("messages", f"{where}.source: a base64 source needs its 'data' (base64 text) and "
                      "'media_type'", "invalid_type")
        return take_source(data_url(payload, media_type), where, images)
    if kind == "url":
        if not isinstance(source.get("url"), str) or not source["url"]:
            raise bad("messages", f"{where}.source: a url source needs its 'url'", "invalid_type")
        return take_source(source["url"], where, images)
    raise bad("messages", f"{where}.source: image sources of type {kind!r} are not supported; send a base64 "
              "source or a url source (a data: URL)", "unsupported_parameter")


def _system(system: Any) -> list[dict[str, Any]]:
    text = _text_blocks(system, "system", "system")
    return [{"role": "system", "content": text}] if text else []


def _messages(messages: Any, images: list[str]) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not messages:
        raise bad("messages", "'messages' must be a non-empty list of {role, content} objects", "invalid_type")
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise bad("messages", f"{where} must be an object", "invalid_type")
        role = message.get("role")
        if role not in ("user", "assistant"):
            raise bad("messages", f"{where}.role must be 'user' or 'assistant', not {role!r} (a system prompt "
                      "goes in 'system')")
        content = message.get("content")
        if isinstance(content, str):
            out.append({"role": role, "content": content})
        elif isinstance(content, list):
            out.extend(_assistant(content, where) if role == "assistant" else _user(content, where, images))
        else:
            raise bad("messages", f"{where}.content must be a string or a list of content blocks", "invalid_type")
    return out


def _user(blocks: list[Any], where: str, images: list[str]) -> list[dict[str, Any]]:
    """A user turn's blocks, in order: each tool_result a ``tool`` message, runs of text and images one user
    message (an image's marker where it stood, its source appended to ``images``)."""
    out: list[dict[str, Any]] = []
    text: list[str] = []
    for j, block in enumerate(blocks):
        at = f"{where}.content[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            text.append(block["text"])
        elif kind == "image":
            text.append(_image(block, at, images))
        elif kind == "tool_result":
            if text:
                out.append({"role": "user", "content": "".join(text)})
                text = []
            tool_use_id = block.get("tool_use_id")
            if not isinstance(tool_use_id, str) or not tool_use_id:
                raise bad("messages", f"{at}.tool_use_id must be the id of the tool_use block it answers",
                          "invalid_type")
            result = _text_blocks(block.get("content"), f"{at}.content", "messages", images)
            is_error = block.get("is_error", False)
            if is_error not in (True, False, None):
                raise bad("messages", f"{at}.is_error must be true or false", "invalid_type")
            out.append({"role": "tool", "tool_call_id": tool_use_id,
                        "content": ERROR_PREFIX + result if is_error else result})
        elif kind in _DROPPED_BLOCKS:
            continue
        else:
            raise bad("messages", f"{at}: {_kind(block)} are not supported in a user turn; send text, image "
                      "and tool_result blocks", "unsupported_parameter")
    if text or not out:
        out.append({"role": "user", "content": "".join(text)})
    return out


def _assistant(blocks: list[Any], where: str) -> list[dict[str, Any]]:
    """An assistant turn's blocks: its text joined, its tool_use blocks OpenAI ``tool_calls``."""
    text: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        at = f"{where}.content[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            text.append(block["text"])
        elif kind == "tool_use":
            name, call_id, arguments = block.get("name"), block.get("id"), block.get("input", {})
            if not isinstance(name, str) or not name or not isinstance(call_id, str) or not call_id:
                raise bad("messages", f"{at}: a tool_use block needs a string 'id' and 'name'", "invalid_type")
            if not isinstance(arguments, dict):
                raise bad("messages", f"{at}.input must be an object", "invalid_type")
            calls.append({"id": call_id, "type": "function",
                          "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}})
        elif kind in _DROPPED_BLOCKS:
            continue
        else:
            raise bad("messages", f"{at}: {_kind(block)} are not supported in an assistant turn; send text and "
                      "tool_use blocks", "unsupported_parameter")
    message: dict[str, Any] = {"role": "assistant", "content": "".join(text)}
    if calls:
        message["tool_calls"] = calls
    return [message]


def _tools(tools: Any) -> list[dict[str, Any]]:
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise bad("tools", "'tools' must be a list of tools", "invalid_type")
    out = []
    names: set[str] = set()
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise bad("tools", f"tools[{i}] must be an object", "invalid_type")
        kind = tool.get("type")
        if kind not in (None, "custom"):
            raise bad("tools", f"tools[{i}]: the server tool {kind!r} is not available here; this server runs "
                      "only custom tools ({name, description, input_schema}) that the client executes",
                      "unsupported_parameter")
        name, schema = tool.get("name"), tool.get("input_schema")
        if not isinstance(schema, dict):
            raise bad("tools", f"tools[{i}].input_schema must be a JSON schema object", "invalid_type")
        out.append(function_tool(f"tools[{i}]", name, schema, tool.get("description"), tool.get("strict"),
                                 schema_field="input_schema"))
        if name in names:
            raise bad("tools", f"tools[{i}]: the tool name {name!r} is used twice")
        names.add(name)
    return out


def _tool_choice(choice: Any, tools: list[dict[str, Any]]) -> str | dict[str, Any]:
    if choice is None:
        return "auto"
    if not isinstance(choice, dict) or not isinstance(choice.get("type"), str):
        raise bad("tool_choice", "'tool_choice' must be an object such as {\"type\": \"auto\"}", "invalid_type")
    kind = choice["type"]
    if kind in ("auto", "none"):
        return kind
    if not tools:
        raise bad("tool_choice", f"'tool_choice' {kind!r} needs 'tools'")
    if kind == "any":
        return "required"
    if kind == "tool":
        name = choice.get("name")
        if name not in {t["function"]["name"] for t in tools}:
            raise bad("tool_choice", f"'tool_choice' names the tool {name!r}, which is not in 'tools'")
        return {"type": "function", "function": {"name": name}}
    raise bad("tool_choice", f"'tool_choice.type' must be auto, any, tool or none, not {kind!r}")


def _stop_sequences(body: dict[str, Any]) -> list[str]:
    value = body.get("stop_sequences")
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise bad("stop_sequences", f"'stop_sequences' must be a list of strings, not {value!r}", "invalid_type")
    if len(value) > MAX_STOP_SEQUENCES:
        raise bad("stop_sequences", f"'stop_sequences' may hold at most {MAX_STOP_SEQUENCES} strings, "
                  f"not {len(value)}")
    return [s for s in value if s]


def _output_schema(body: dict[str, Any]) -> dict[str, Any] | None:
    config = body.get("output_config")
    if config is not None and not isinstance(config, dict):
        raise bad("output_config", "'output_config' must be an object", "invalid_type")
    fmt, param = (config or {}).get("format"), "output_config"
    if fmt is None:
        fmt, param = body.get("output_format"), "output_format"
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
        raise bad(param, f"'{param}' format must be {{\"type\": \"json_schema\", \"schema\": {{…}}}}",
                  "invalid_type")
    return fmt["schema"]


# -- response out -----------------------------------------------------------------
def message_id() -> str:
    return f"msg_{secrets.token_hex(12)}"


def stop_reason(reply: Reply, stop_sequence: str | None = None) -> str:
    """end_turn | max_tokens | stop_sequence | tool_use; max_tokens wins (a call cut short is incomplete)."""
    if reply.finish == "length":
        return "max_tokens"
    if reply.tool_calls:
        return "tool_use"
    if reply.finish == "stop" and stop_sequence:
        return "stop_sequence"
    return STOP_REASONS.get(reply.finish, "end_turn")


def usage(reply: Reply) -> dict[str, int]:
    cached = min(reply.cached_tokens, reply.prompt_tokens)
    return {"input_tokens": reply.prompt_tokens - cached, "output_tokens": reply.completion_tokens,
            "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0}


def content_blocks(reply: Reply) -> list[dict[str, Any]]:
    """The reply as content blocks: thinking (when the model wrote one), text, then one tool_use per call."""
    blocks: list[dict[str, Any]] = []
    if reply.reasoning:
        blocks.append({"type": "thinking", "thinking": reply.reasoning, "signature": ""})
    if reply.content or not reply.tool_calls:
        blocks.append({"type": "text", "text": reply.content})
    for call in reply.tool_calls:
        blocks.append({"type": "tool_use", "id": call.id, "name": call.name,
                       "input": arguments_object(call.arguments)})
    return blocks


def response(reply: Reply, *, message_id_: str | None = None, stop_sequence: str | None = None) -> dict[str, Any]:
    """The ``message`` object for a whole (non-streamed) reply. ``stop_sequence`` is the stop string that
    ended it, when one did (else ``reply.stop_sequence``)."""
    stop_sequence = stop_sequence or reply.stop_sequence
    reason = stop_reason(reply, stop_sequence)
    return {"id": message_id_ or message_id(), "type": "message", "role": "assistant", "model": reply.model,
            "content": content_blocks(reply), "stop_reason": reason,
            "stop_sequence": stop_sequence if reason == "stop_sequence" else None, "usage": usage(reply)}


def count_tokens_body(input_tokens: int) -> dict[str, int]:
    """The ``/v1/messages/count_tokens`` answer."""
    return {"input_tokens": input_tokens}


def error_type(status: int) -> str:
    if status in ERROR_TYPES:
        return ERROR_TYPES[status]
    return "invalid_request_error" if status < 500 else "api_error"


def error_body(err: ApiError) -> dict[str, Any]:
    """``{"type": "error", "error": {"type", "message"}}``, the type from the status."""
    return {"type": "error", "error": {"type": error_type(err.status), "message": err.message}}


# -- streaming out ------------------------------------------------------------------
def sse(event: str, data: dict[str, Any]) -> str:
    """One server-sent event as Anthropic writes it: the event name, and its JSON (whose ``type`` repeats it)."""
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False, separators=(',', ':'))}\n\n"


class Stream:
    """A reply's progress as Anthropic's events: ``message_start``, then content blocks
    (``content_block_start`` / ``_delta`` / ``_stop``: thinking, text, then each tool_use with its input as
    one ``input_json_delta``), ``message_delta`` with the stop reason and usage, ``message_stop``.

    Each method returns the wire strings to write, in order.
    """

    def __init__(self, model: str, *, input_tokens: int = 0, cached_tokens: int = 0,
                 message_id_: str | None = None) -> None:
        self.model, self.id = model, message_id_ or message_id()
        self.input_tokens, self.cached_tokens = input_tokens, cached_tokens
        self.index = -1  # the open block's index (blocks are numbered from 0 in order)
        self.open: str | None = None  # "text" | "thinking" | None
        self.sent_text = ""
        self.sent_reasoning = ""
        self.started = self.finished = False

    def start(self) -> list[str]:
        self.started = True
        cached = min(self.cached_tokens, self.input_tokens)
        usage_ = {"input_tokens": self.input_tokens - cached, "output_tokens": 0, "cache_read_input_tokens": cached,
                  "cache_creation_input_tokens": 0}
        message: dict[str, Any] = {"id": self.id, "type": "message", "role": "assistant", "model": self.model,
                                   "content": [], "stop_reason": None, "stop_sequence": None, "usage": usage_}
        return [sse("message_start", {"type": "message_start", "message": message}), self.ping()]

    def ping(self) -> str:
        return sse("ping", {"type": "ping"})

    def _open(self, kind: str) -> list[str]:
        if self.open == kind:
            return []
        out = self._close()
        self.index += 1
        self.open = kind
        block = {"type": "text", "text": ""} if kind == "text" else {"type": "thinking", "thinking": "",
                                                                       "signature": ""}
        out.append(sse("content_block_start", {"type": "content_block_start", "index": self.index,
                                               "content_block": block}))
        return out

    def _close(self) -> list[str]:
        if self.open is None:
            return []
        out = []
        if self.open == "thinking":
            out.append(sse("content_block_delta", {"type": "content_block_delta", "index": self.index,
                                                   "delta": {"type": "signature_delta", "signature": ""}}))
        self.open = None
        out.append(sse("content_block_stop", {"type": "content_block_stop", "index": self.index}))
        return out

    def text(self, delta: str) -> list[str]:
        if not delta:
            return []
        out = [] if self.started else self.start()
        out += self._open("text")
        self.sent_text += delta
        out.append(sse("content_block_delta", {"type": "content_block_delta", "index": self.index,
                                               "delta": {"type": "text_delta", "text": delta}}))
        return out

    def reasoning(self, delta: str) -> list[str]:
        """A piece of the model's thinking (a ``thinking`` block before the text)."""
        if not delta:
            return []
        out = [] if self.started else self.start()
        out += self._open("thinking")
        self.sent_reasoning += delta
        out.append(sse("content_block_delta", {"type": "content_block_delta", "index": self.index,
                                               "delta": {"type": "thinking_delta", "thinking": delta}}))
        return out

    def finish(self, reply: Reply, *, stop_sequence: str | None = None) -> list[str]:
        """The rest: text the deltas have not carried yet (when they were a prefix of the reply's text),
        the tool_use blocks, the stop reason and the usage."""
        out = [] if self.started else self.start()
        if reply.reasoning.startswith(self.sent_reasoning) and reply.reasoning != self.sent_reasoning \
                and not self.sent_text:
            out += self.reasoning(reply.reasoning[len(self.sent_reasoning):])
        if reply.content.startswith(self.sent_text) and reply.content != self.sent_text:
            out += self.text(reply.content[len(self.sent_text):])
        if self.index < 0 and not reply.tool_calls:  # an empty reply still has its (empty) text block
            out += self._open("text")
        out += self._close()
        for call in reply.tool_calls:
            self.index += 1
            out.append(sse("content_block_start", {
                "type": "content_block_start", "index": self.index,
                "content_block": {"type": "tool_use", "id": call.id, "name": call.name, "input": {}}}))
            arguments = json.dumps(arguments_object(call.arguments), ensure_ascii=False)
            out.append(sse("content_block_delta", {"type": "content_block_delta", "index": self.index,
                                                   "delta": {"type": "input_json_delta", "partial_json": arguments}}))
            out.append(sse("content_block_stop", {"type": "content_block_stop", "index": self.index}))
        stop_sequence = stop_sequence or reply.stop_sequence
        reason = stop_reason(reply, stop_sequence)
        out.append(sse("message_delta", {
            "type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": stop_sequence if reason == "stop_sequence" else None},
            "usage": usage(reply)}))
        out.append(sse("message_stop", {"type": "message_stop"}))
        self.finished = True
        return out

    def error(self, err: ApiError) -> list[str]:
        """An error once the stream has begun: Anthropic's ``error`` event (the official client raises it)."""
        self.finished = True
        return [sse("error", error_body(err))]
