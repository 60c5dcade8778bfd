"""The ASGI application: routes, the API key check, CORS and the body limit.

``create_app(link, config)`` builds a Starlette app around an
:class:`~engine.server.engine_link.EngineLink`; uvicorn serves it
(``engine/server/runner.py``). Request bodies become worker requests in
``openai_format``; a request's trip through the queue and the worker is a
:class:`~engine.server.generation.Generation`.

A client that disconnects is noticed while the request waits, runs or
streams, and its generation is cancelled in the worker (the worker checks
between decode steps).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import time
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from engine.netaddr import is_loopback
from engine.server import anthropic_format as A
from engine.server import api_key
from engine.server import dialects as D
from engine.server import ollama_format as O
from engine.server import openai_format as F
from engine.server import plan as plans
from engine.server.config import ServerConfig
from engine.server.engine_link import EngineLink
from engine.server.generation import Gate, Generation, engine_error
from engine.server.metrics import Metrics, RequestRecord
from engine.server.model_routes import ModelRoutes
from engine.server.reply import Reply
from engine.server.response_store import ResponseStore
from engine.worker import protocol as P

# a streamed delta: its text, whether it is reasoning, and (asked for) the logprobs of its tokens
Piece = tuple[str, bool, "list[P.TokenLogprobs] | None"]
HEALTH_PROBE_TIMEOUT_S = 3.0  # a worker answers a ping from its reader thread in milliseconds, even mid-reply
# the log's names for refused calls (bounded)
ROUTES = ("chat/completions", "completions", "models", "metrics", "messages", "messages/count_tokens", "responses",
          "api/chat", "api/generate", "tokenize", "detokenize")
def error_response(err: F.ApiError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]", "::1")


# a name (or a bracketed IPv6 address) and at most a numeric port, nothing else: "[::1]evil.example" and
# "127.0.0.1:1@evil.example" are not loopback names with something after them, they are other names
_HOST_HEADER = re.compile(r"(\[[0-9a-f:.]*\]|[^:\[\]@/\\?#\s]*)(?::[0-9]{1,5})?")


def _host_name(host_header: str) -> str:
    """``127.0.0.1:8181`` -> ``127.0.0.1``; ``[::1]:8181`` -> ``[::1]``; anything else as it is."""
    match = _HOST_HEADER.fullmatch(host_header)
    return match.group(1) if match else host_header


class LoopbackHostCheck:
    """On a loopback bind, refuse requests whose ``Host`` is not a loopback name (421).

    Why: a web page can point a DNS name of its own at 127.0.0.1 ("DNS
    rebinding") and then read the answers of a keyless local server as if
    they were its own origin's; such requests carry that name in ``Host``.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            host = dict(scope["headers"]).get(b"host", b"").decode("latin-1").strip().lower()
            if _host_name(host) not in LOOPBACK_HOSTS:
                err = F.ApiError(421, f"This server answers only as 127.0.0.1 or localhost, not {host!r}.",
                                 code="wrong_host")
                await error_response(err)(scope, receive, send)
                return
        await self.app(scope, receive, send)


class ApiKeyCheck:
    """401 unless ``Authorization: Bearer <key>`` matches (constant time); ``/health`` and CORS preflights pass."""

    def __init__(self, app: ASGIApp, key: str | None, metrics: Metrics) -> None:
        self.app, self.key, self.metrics = app, key, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.key is None or scope["path"] == "/health" or scope["method"] == "OPTIONS":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        scheme, _, given = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
        anthropic_key = headers.get(b"x-api-key", b"").decode("latin-1")  # Anthropic's clients send it here
        if (scheme.lower() == "bearer" and api_key.matches(given.strip(), self.key)) or \
                (anthropic_key and api_key.matches(anthropic_key.strip(), self.key)):
            await self.app(scope, receive, send)
            return
        err = F.ApiError(401, "Missing or wrong API key: send 'Authorization: Bearer <key>' (or 'x-api-key: <key>') "
                         "with the key shown in MTP Studio's Local server panel (or given to mtp-studio serve).",
                         code="invalid_api_key")
        path = scope["path"].removeprefix("/v1/").strip("/")
        self.metrics.record(RequestRecord(when=time.time(), endpoint=path if path in ROUTES else "other",
                                          status=401, outcome="unauthorized", stream=False))
        if path.startswith("messages"):  # in the shape the Anthropic client reads
            body = A.error_body(err)
            await JSONResponse(body, status_code=401)(scope, receive, send)
            return
        await error_response(err)(scope, receive, send)


class Api(ModelRoutes):
    """The routes and the state they share (queue, metrics, the engine link); the routes that only
    describe the model or its vocabulary are in :class:`~engine.server.model_routes.ModelRoutes`."""

    def __init__(self, link: EngineLink, config: ServerConfig, metrics: Metrics) -> None:
        self.link, self.config, self.metrics = link, config, metrics
        self._gate: Gate | None = None
        self._responses = D.responses(ResponseStore())  # the Responses API's kept responses
        self._probe: asyncio.Future[bool] | None = None

    @property
    def gate(self) -> Gate:
        if self._gate is None:  # made on the server's loop, at the first request
            self._gate = Gate(self.config, self.metrics)
        return self._gate

    def served_ids(self) -> tuple[str, ...]:
        model = self.link.model()
        if model is None:
            return ("",)
        path = Path(model.path)
        ids = [self.config.model_id or path.stem, path.name, path.stem]
        return tuple(dict.fromkeys(ids))

    # -- plain routes ------------------------------------------------------------
    async def health(self, request: Request) -> Response:
        if self.link.model() is None:
            return _unavailable("The engine is (re)starting.")
        if not await self._responsive():
            return _unavailable(f"The engine has not answered for {HEALTH_PROBE_TIMEOUT_S:g} s: it is stopped or "
                                "stuck.")
        return JSONResponse({"status": "ok"})

    async def _responsive(self) -> bool:
        """One probe of the engine at a time, shared by every ``/health`` waiting (a flood of health
        checks is one ping), on a thread: the probe blocks."""
        if self._probe is None or self._probe.done():
            self._probe = asyncio.ensure_future(asyncio.to_thread(self.link.responsive, HEALTH_PROBE_TIMEOUT_S))
        return bool(await asyncio.shield(self._probe))

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": self._model_objects()})

    async def model(self, request: Request) -> Response:
        wanted = request.path_params["model_id"]
        found = self._model_objects()
        if not found or wanted not in self.served_ids():
            err = F.ApiError(404, f"The model '{wanted}' is not served here (GET /v1/models lists it)",
                             param="model", code="model_not_found")
            return error_response(err)
        return JSONResponse(found[0])

    def _model_objects(self) -> list[dict[str, Any]]:
        model = self.link.model()
        return [] if model is None else [{
            "id": self.served_ids()[0], "object": "model", "created": 0, "owned_by": "mtp-studio",
            "meta": {"architecture": model.architecture, "n_ctx": model.n_ctx, "n_params": model.n_params,
                     "size": model.size_bytes, "mtp": model.mtp, "mtp_heads": model.mtp_heads,
                     "max_draft": model.max_draft, "sidecar": model.sidecar,
                     "speculative_default": self.link.default_speculative().to_json()}}]

    async def metrics_text(self, request: Request) -> Response:
        return PlainTextResponse(self.metrics.prometheus(), media_type="text/plain; version=0.0.4")

    # -- generation routes -------------------------------------------------------
    async def chat(self, request: Request) -> Response:
        return await self._openai(request, "chat")

    async def completions(self, request: Request) -> Response:
        return await self._openai(request, "completions")

    def fingerprint(self) -> str | None:
        build = getattr(self.link, "engine_build", None)
        return F.fingerprint(build() if build is not None else None)

    def loaded(self) -> P.ModelInfo:
        model = self.link.model()
        if model is None:
            raise F.ApiError(503, "The engine is (re)starting; retry in a few seconds.", type_="server_error",
                             code="engine_unavailable", headers={"Retry-After": str(self.config.retry_after_s)})
        return model

    async def _openai(self, request: Request, endpoint: str) -> Response:
        try:
            body = await self._read_json(request)
            model = self.loaded()
            parse = F.parse_chat if endpoint == "chat" else F.parse_completion
            parsed = parse(body, self.served_ids(), model.n_ctx, self.config.strict_model)
        except F.ApiError as err:
            self._reject(endpoint, err)
            return error_response(err)
        try:
            if parsed.stream:
                started = await self.begin(request, endpoint, parsed)
                if started is None:  # the client left
                    return Response(status_code=499)
                return StreamingResponse(self._openai_sse(endpoint, parsed, *started),
                                         media_type="text/event-stream",
                                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
            replies = []
            for choice in range(parsed.n):  # n choices: one generation each, one after another
                reply = await self.complete(request, endpoint, parsed, choice)
                if reply is None:
                    return Response(status_code=499)
                replies.append(reply)
        except F.ApiError as err:
            return error_response(err)
        builder = F.chat_completion if endpoint == "chat" else F.completion
        answer = builder(F.new_id("chatcmpl" if endpoint == "chat" else "cmpl"), F.now(), replies, self.fingerprint())
        answer.update(replies[-1].extras)
        return JSONResponse(answer)

    # -- Anthropic Messages, OpenAI Responses, Ollama -----------------------------------
    async def run_dialect(self, request: Request, dialect: D.Dialect) -> Response:
        """One request of an API beside OpenAI's chat and completions, on the same queue and engine."""

        def refuse(err: F.ApiError) -> Response:
            return JSONResponse(dialect.error_body(err), status_code=err.status, headers=err.headers)

        try:
            body = await self._read_json(request)
            model = self.loaded()
            parsed = dialect.parse(body, self.served_ids(), model.n_ctx, self.config.strict_model)
        except F.ApiError as err:
            self._reject(dialect.name, err)
            return refuse(err)
        if isinstance(parsed, O.LoadCheck):  # Ollama's "load the model": it is loaded
            return JSONResponse(O.load_body(parsed))
        try:
            if parsed.stream:
                started = await self.begin(request, dialect.name, parsed)
                if started is None:
                    return Response(status_code=499)
                return StreamingResponse(self._dialect_stream(dialect, body, parsed, *started),
                                         media_type=dialect.media_type,
                                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
            reply = await self.complete(request, dialect.name, parsed)
        except F.ApiError as err:
            return refuse(err)
        if reply is None:
            return Response(status_code=499)
        return JSONResponse(dialect.answer(reply, body, parsed))

    async def _dialect_stream(self, dialect: D.Dialect, body: Any, parsed: F.ParsedRequest, gen: Generation,
                              plan: plans.Plan, first: P.Event) -> AsyncIterator[str]:
        stream = dialect.stream(self.served_ids()[0], body, parsed)
        try:
            for wire in stream.start():
                yield wire
            async for piece in self.pieces(gen, plan, first):
                wires = stream.finish(piece) if isinstance(piece, Reply) else \
                    [wire for text, reasoning, _ in piece for wire in (stream.reasoning(text) if reasoning
                                                                       else stream.text(text))]
                yield "".join(wires)
        except F.ApiError as err:  # the engine's error or the timeout, once the stream has begun
            for wire in stream.error(err):
                yield wire
        finally:
            self.settle(gen)

    async def messages(self, request: Request) -> Response:
        return await self.run_dialect(request, D.MESSAGES)

    async def responses(self, request: Request) -> Response:
        return await self.run_dialect(request, self._responses)

    async def ollama_chat(self, request: Request) -> Response:
        return await self.run_dialect(request, D.OLLAMA_CHAT)

    async def ollama_generate(self, request: Request) -> Response:
        return await self.run_dialect(request, D.OLLAMA_GENERATE)

    async def count_tokens(self, request: Request) -> Response:
        """Anthropic's ``/v1/messages/count_tokens``: the prompt the same body would decode, rendered by the
        worker with the model's template and tools, nothing generated."""
        try:
            body = await self._read_json(request)
            model = self.loaded()
            if isinstance(body, dict):
                body = {**body, "max_tokens": body.get("max_tokens", 1), "stream": False}
            parsed = A.parse(body, self.served_ids(), model.n_ctx, strict_model=self.config.strict_model)
            reply = await self.complete(request, "messages", dataclasses.replace(parsed, max_tokens=0))
        except F.ApiError as err:
            return JSONResponse(A.error_body(err), status_code=err.status, headers=err.headers)
        if reply is None:
            return Response(status_code=499)
        return JSONResponse(A.count_tokens_body(reply.prompt_tokens))

    # -- what every API's routes share ------------------------------------------
    async def begin(self, request: Request, endpoint: str, parsed: F.ParsedRequest,
                    choice: int = 0) -> tuple[Generation, plans.Plan, P.Event] | None:
        """Queue and start one generation; its first event (a token or the end). None: the client left.

        Raises:
            ApiError: refused before it ran (the queue, the engine, a bad value), or the engine's error
                before the first token; each path has given back what it held.
        """
        try:
            model = self.loaded()
            default = self.link.default_speculative(self.gate.concurrency_next())
            plan = plans.make(parsed, model, default, choice=choice, template=self.config.chat_template,
                              image_files=self.config.local_images)
            # everything that can fail is made before the place in line is taken: from admit() on, each
            # path out gives it back (the generation's own endings, or the handlers below)
            gen = Generation(self.link, self.gate, self.config, self.metrics, endpoint, parsed.stream)
            try:
                message = P.GenerateRequestMsg(id=gen.id, **plan.fields)
            except ValueError as exc:
                raise F.bad("body", str(exc)) from None
            self.gate.admit()
        except F.ApiError as err:
            self._reject(endpoint, err)
            raise
        try:  # until the first token (or the end), the answer can still be a proper HTTP error
            first = await _unless_disconnected(request, self._first_event(gen, message), gen)
        except F.ApiError as err:
            gen.status = err.status
            gen.record()
            raise
        if first is None:
            return None
        return gen, plan, first

    async def complete(self, request: Request, endpoint: str, parsed: F.ParsedRequest,
                       choice: int = 0) -> Reply | None:
        """Run one generation to its end and answer with its :class:`Reply`; None: the client left.

        Raises:
            ApiError: as :meth:`begin`, or the engine's error (recorded).
        """
        started = await self.begin(request, endpoint, parsed, choice)
        if started is None:
            return None
        gen, plan, first = started
        done = await _unless_disconnected(request, self._collect(gen, first), gen)
        if done is None:
            return None
        return self.reply(gen, plan)

    async def _collect(self, gen: Generation, first: P.Event) -> bool:
        try:
            while not gen.finished:
                await gen.next_event()
        except F.ApiError as err:
            gen.status = err.status
            gen.record()
            raise
        if gen.outcome.finish == "error":
            failure = engine_error(gen.outcome.error)
            gen.status = failure.status
            gen.record()
            raise failure
        gen.record()
        return True

    def reply(self, gen: Generation, plan: plans.Plan) -> Reply:
        out = gen.outcome
        stats = out.stats
        return plans.reply(plan, self.served_ids()[0], out.text, out.finish,
                           prompt_tokens=stats.prompt_tokens if stats else 0, completion_tokens=out.n_tokens,
                           cached_tokens=stats.prompt_reused if stats else 0, logprobs=out.logprobs,
                           stop=out.stop, reasoning=out.reasoning, extras=self._extras(gen, plan))

    async def pieces(self, gen: Generation, plan: plans.Plan,
                     first: P.Event) -> AsyncIterator[list[Piece] | Reply]:
        """A running generation as deltas ``(text, is_reasoning, logprobs)`` (tool-call markup held back
        from the answer; the logprobs of the tokens behind an answer delta, when asked for), then its
        :class:`Reply`. Deltas come in lists: all that arrived since the last, one per
        token event, so a stream writes them in one go but still as one chunk per token. The caller's
        ``finally`` calls :meth:`settle`.

        Raises:
            ApiError: the engine's error or the timeout, once the stream has begun.
        """
        shown = plans.TextFilter(plan.family)
        events = [first]
        while True:
            # everything that has arrived goes out in one write: fewer wake-ups under load
            visible = [(ev.text, True, None) if ev.reasoning else (shown.feed(ev.text), False, ev.logprobs)
                       for ev in events if isinstance(ev, P.TokenEvent) and ev.text]
            visible = [piece for piece in visible if piece[0]]
            if visible:
                yield visible
            if gen.finished:
                break
            events = [await gen.next_event(), *gen.ready_events()]
        if gen.outcome.finish == "error":
            raise engine_error(gen.outcome.error)
        final = self.reply(gen, plan)
        rest = shown.rest(final)
        if rest:
            yield [(rest, False, None)]
        yield final

    @staticmethod
    def settle(gen: Generation) -> None:
        """A stream's end, however it came: a disconnect cancels the generation in the worker."""
        if not gen.finished:
            gen.abandon("disconnected")
        else:
            gen.record()

    def _extras(self, gen: Generation, plan: plans.Plan) -> dict[str, Any]:
        out = gen.outcome
        extras: dict[str, Any] = {"timings": F.timings(out.stats, out.n_tokens)}
        if gen.speculative is not None:
            extras["speculative"] = F.speculative_report(out.stats, gen.speculative)
            notes = (*out.notes, *plan.notes)
            if notes:
                extras["speculative"]["note"] = " ".join(notes)
        return extras

    async def _first_event(self, gen: Generation, message: P.GenerateRequestMsg) -> P.Event:
        await gen.start(message)
        while True:
            event = await gen.next_event()
            if isinstance(event, P.TokenEvent) or P.is_final(event):
                if gen.outcome.error is not None and gen.finished:
                    raise engine_error(gen.outcome.error)
                return event

    async def _openai_sse(self, endpoint: str, parsed: F.ParsedRequest, gen: Generation, plan: plans.Plan,
                          first: P.Event) -> AsyncIterator[str]:
        rid = F.new_id("chatcmpl" if endpoint == "chat" else "cmpl")
        created, model, usage, fp = F.now(), self.served_ids()[0], parsed.include_usage, self.fingerprint()

        def chunk(text: str | None, finish: str | None, logprobs: Any = None, delta: Any = None) -> dict[str, Any]:
            if endpoint == "chat":
                return F.chat_chunk(rid, created, model, delta or ({} if text is None else {"content": text}),
                                    finish, usage, fp, F.chat_logprobs(logprobs))
            return F.completion_chunk(rid, created, model, text or "", finish, usage, fp,
                                      F.completion_logprobs(logprobs))

        try:
            if endpoint == "chat":
                yield _sse_data(chunk(None, None, delta={"role": "assistant", "content": ""}))
            final: Reply | None = None
            async for piece in self.pieces(gen, plan, first):
                if isinstance(piece, Reply):
                    final = piece
                else:
                    yield "".join(_sse_data(chunk(None, None, delta={"reasoning_content": text}) if reasoning
                                            else chunk(text, None, plans.logprobs_of(entries)))
                                  for text, reasoning, entries in piece)
            assert final is not None
            if final.tool_calls:
                calls = [{"index": i, **call} for i, call in enumerate(F.tool_call_objects(final.tool_calls))]
                yield _sse_data(chunk(None, None, delta={"tool_calls": calls}))
            # each answer chunk carried its tokens' logprobs; the last chunk carries none
            last = chunk(None, final.finish)
            last.update(final.extras)
            yield _sse_data(last)
            if usage:
                yield _sse_data(F.usage_chunk(rid, created, model, endpoint, F.reply_usage([final]), fp))
            yield "data: [DONE]\n\n"
        except F.ApiError as err:  # the engine's error or the timeout, once the stream has begun
            yield _sse_data(err.body())
            yield "data: [DONE]\n\n"
        finally:  # a disconnect cancels this generator: stop the generation in the worker
            self.settle(gen)

    # -- helpers -----------------------------------------------------------------
    async def _read_json(self, request: Request) -> Any:
        # JSON only: a web page may send a form or text/plain POST to 127.0.0.1 without asking (no CORS
        # preflight), but never application/json
        content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if content_type != "application/json":
            raise F.ApiError(415, f"Send the body as JSON with 'Content-Type: application/json' "
                             f"(got {content_type or 'none'!r}).", code="unsupported_media_type")
        limit = self.config.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise F.ApiError(413, f"The request body is larger than the limit of {limit:,} bytes.",
                             code="request_too_large")
        chunks, size = [], 0
        try:
            async for piece in request.stream():
                size += len(piece)
                if size > limit:
                    raise F.ApiError(413, f"The request body is larger than the limit of {limit:,} bytes.",
                                     code="request_too_large")
                chunks.append(piece)
        except ClientDisconnect:  # gone, or cut off by the body deadline (engine/server/deadlines.py)
            raise F.ApiError(400, "The connection closed before the whole body arrived.",
                             code="incomplete_body") from None
        try:
            return json.loads(b"".join(chunks))
        except RecursionError:
            raise F.bad("body", "The request body is nested too deeply.", "invalid_json") from None
        except ValueError as exc:
            raise F.bad("body", f"The request body is not valid JSON: {exc}", "invalid_json") from None

    def _reject(self, endpoint: str, err: F.ApiError) -> None:
        self.metrics.record(RequestRecord(when=time.time(), endpoint=endpoint, status=err.status,
                                          outcome="rejected", stream=False))


def _unavailable(message: str) -> JSONResponse:
    return JSONResponse({"status": "unavailable", "error": {"message": message, "type": "unavailable_error",
                         "code": 503}}, status_code=503)


def _sse_data(data: Any) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False, separators=(',', ':'))}\n\n"


async def _unless_disconnected(request: Request, work: Awaitable[Any], gen: Generation) -> Any:
    """Run ``work`` unless the client disconnects first (then cancel the generation and return None)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnect(request.receive))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        watcher.cancel()
        gen.abandon("disconnected")
        raise
    watcher.cancel()
    if task in done:
        try:
            return task.result()
        except F.ApiError:  # an answer already: the generation has ended, or gave back what it held
            raise
        except Exception:  # a bug on this path must not keep the turn: cancel in the worker, drain, move on
            gen.abandon("error")
            gen.status = 500
            gen.record()
            raise
    task.cancel()
    gen.abandon("disconnected")
    return None


async def _disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own refusals (no such route, wrong method) in OpenAI's error shape, not plain text."""
    assert isinstance(exc, HTTPException)
    status = exc.status_code
    if status == 404:
        message, code = (f"There is no {request.url.path} here; the APIs are OpenAI's under /v1 (GET /v1/models), "
                         "Anthropic's /v1/messages and Ollama's under /api (docs/server.md).", "not_found")
    elif status == 405:
        message, code = f"{request.method} is not allowed on {request.url.path}.", "method_not_allowed"
    else:
        message, code = str(exc.detail), "http_error"
    return error_response(F.ApiError(status, message, code=code, headers=dict(exc.headers or {})))


async def _server_error(request: Request, exc: Exception) -> Response:
    """A bug answers as a JSON error too (its traceback goes to the log, not to the client)."""
    return error_response(F.ApiError(500, f"The server failed on this request ({type(exc).__name__}); "
                                     "its log has the details.", type_="server_error", code="internal_error"))


def create_app(link: EngineLink, config: ServerConfig, metrics: Metrics | None = None) -> Starlette:
    metrics = metrics or Metrics()
    metrics.sequences = config.parallel
    api = Api(link, config, metrics)
    middleware = []
    if config.cors_origins:
        middleware.append(Middleware(CORSMiddleware, allow_origins=list(config.cors_origins),
                                     allow_methods=["GET", "POST", "OPTIONS"],
                                     allow_headers=["Authorization", "Content-Type", "x-api-key",
                                                    "anthropic-version"]))
    if is_loopback(config.host):
        middleware.insert(0, Middleware(LoopbackHostCheck))
    middleware.append(Middleware(ApiKeyCheck, key=config.api_key, metrics=metrics))
    routes = [
        Route("/health", api.health, methods=["GET"]),
        Route("/metrics", api.metrics_text, methods=["GET"]),
        Route("/tokenize", api.tokenize, methods=["POST"]),
        Route("/detokenize", api.detokenize, methods=["POST"]),
        Route("/", api.root, methods=["GET", "HEAD"]),
        Route("/v1/messages", api.messages, methods=["POST"]),
        Route("/v1/messages/count_tokens", api.count_tokens, methods=["POST"]),
        Route("/v1/responses", api.responses, methods=["POST"]),
        Route("/responses", api.responses, methods=["POST"]),
        Route("/api/chat", api.ollama_chat, methods=["POST"]),
        Route("/api/generate", api.ollama_generate, methods=["POST"]),
        Route("/api/tags", api.ollama_tags, methods=["GET"]),
        Route("/api/ps", api.ollama_ps, methods=["GET"]),
        Route("/api/show", api.ollama_show, methods=["POST"]),
        Route("/api/version", api.ollama_version, methods=["GET"]),
    ]
    for prefix in ("/v1", ""):  # the OpenAI routes answer without /v1 too, as llama-server's do
        routes += [
            Route(f"{prefix}/models", api.models, methods=["GET"]),
            Route(f"{prefix}/models/{{model_id:path}}", api.model, methods=["GET"]),
            Route(f"{prefix}/chat/completions", api.chat, methods=["POST"]),
            Route(f"{prefix}/completions", api.completions, methods=["POST"]),
        ]
    app = Starlette(routes=routes, middleware=middleware,
                    exception_handlers={HTTPException: _http_error, Exception: _server_error})
    app.state.api = api
    return app
