"""The APIs beside OpenAI's, as one shape the routes can run: Anthropic Messages
(``/v1/messages``), OpenAI Responses (``/v1/responses``) and Ollama
(``/api/chat``, ``/api/generate``).

Each is a :class:`Dialect`: how its body becomes a ``ParsedRequest``, how a
:class:`Reply` becomes its answer, how a reply streams, and how it words an
error. The translation lives in one module per API (``anthropic_format``,
``responses_format``, ``ollama_format``); the queue, the engine, the tool
calls and the speculation report are the same for all (``app.Api``), so a
greedy reply is the same text through every API.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from engine.server import anthropic_format as A
from engine.server import ollama_format as O
from engine.server import responses_format as R
from engine.server.openai_format import ApiError, ParsedRequest
from engine.server.reply import Reply
from engine.server.response_store import ResponseStore


class Stream(Protocol):
    def start(self) -> list[str]: ...

    def text(self, delta: str) -> list[str]: ...

    def reasoning(self, delta: str) -> list[str]: ...

    def finish(self, reply: Reply) -> list[str]: ...

    def error(self, err: ApiError) -> list[str]: ...


Parse = Callable[[Any, tuple[str, ...], int, bool], "ParsedRequest | O.LoadCheck"]


@dataclass(frozen=True)
class Dialect:
    name: str  # the request log's endpoint name
    parse: Parse
    answer: Callable[[Reply, Any, ParsedRequest], dict[str, Any]]  # (reply, request body, parsed) -> body
    stream: Callable[[str, Any, ParsedRequest], Stream]  # (model id, request body, parsed) -> its stream
    error_body: Callable[[ApiError], dict[str, Any]]
    media_type: str = "text/event-stream"


def _anthropic_stream(model: str, body: Any, parsed: ParsedRequest) -> Stream:
    return A.Stream(model)


MESSAGES = Dialect(
    name="messages",
    parse=lambda body, served, n_ctx, strict: A.parse(body, served, n_ctx, strict_model=strict),
    answer=lambda reply, body, parsed: A.response(reply),
    stream=_anthropic_stream,
    error_body=A.error_body,
)

def responses(store: ResponseStore) -> Dialect:
    """The Responses API over ``store``: a request may continue a kept response, and each response is
    kept unless the request says ``store: false``."""

    def keep(rid: str, body: Any, parsed: ParsedRequest, reply: Reply) -> None:
        if body.get("store", True) is False:
            return
        messages = list(parsed.messages or [])
        if body.get("instructions"):  # a continuation does not inherit instructions (as OpenAI's)
            messages = messages[1:]
        store.keep(rid, messages, reply, parsed.images)

    def answer(reply: Reply, body: Any, parsed: ParsedRequest) -> dict[str, Any]:
        rid = R.response_id()
        keep(rid, body, parsed, reply)
        return R.response(reply, body, rid=rid)

    class KeptStream(R.Stream):
        def __init__(self, model: str, body: Any, parsed: ParsedRequest) -> None:
            super().__init__(model, body)
            self.body, self.parsed = body, parsed

        def finish(self, reply: Reply) -> list[str]:
            keep(self.id, self.body, self.parsed, reply)
            return super().finish(reply)

    return Dialect(
        name="responses",
        parse=lambda body, served, n_ctx, strict: R.parse(body, served, n_ctx, strict_model=strict,
                                                          history=store.conversation),
        answer=answer,
        stream=KeptStream,
        error_body=R.error_body,
    )

OLLAMA_CHAT = Dialect(
    name="api/chat",
    parse=lambda body, served, n_ctx, strict: O.parse_chat(body, served, n_ctx, strict_model=strict),
    answer=lambda reply, body, parsed: O.chat_response(reply),
    stream=lambda model, body, parsed: O.Stream(model, chat=True),
    error_body=O.error_body,
    media_type="application/x-ndjson",
)

OLLAMA_GENERATE = Dialect(
    name="api/generate",
    parse=lambda body, served, n_ctx, strict: O.parse_generate(body, served, n_ctx, strict_model=strict),
    answer=lambda reply, body, parsed: O.generate_response(reply),
    stream=lambda model, body, parsed: O.Stream(model, chat=False),
    error_body=O.error_body,
    media_type="application/x-ndjson",
)
