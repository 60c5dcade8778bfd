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
from engine.server import api_key
from engine.server import openai_format as F
from engine.server.config import ServerConfig
from engine.server.engine_link import EngineLink
from engine.server.generation import Gate, Generation
from engine.server.metrics import Metrics, RequestRecord
from engine.worker import protocol as P

HEALTH_PROBE_TIMEOUT_S = 3.0  # a worker answers a ping from its reader thread in milliseconds, even mid-reply
ROUTES = ("chat/completions", "completions", "models", "metrics")  # the log's names for refused calls (bounded)
# worker error kinds that are the request's fault (400); others are the server's (500)
CLIENT_ERRORS = {"context": "context_length_exceeded", "protocol": "invalid_request", "template": "template_error"}


def error_response(err: F.ApiError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


def _engine_error(event: P.ErrorEvent | None) -> F.ApiError:
    if event is None:
        return F.ApiError(500, "The generation ended with an error.", type_="server_error", code="engine_error")
    if event.kind in ("worker_died", "no_model"):
        return F.ApiError(503, event.message, type_="server_error", code="worker_died", headers={"Retry-After": "5"})
    if event.kind in CLIENT_ERRORS:
        return F.ApiError(400, event.message, code=CLIENT_ERRORS[event.kind])
    return F.ApiError(500, event.message, type_="server_error", code=event.kind)


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
        header = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
        scheme, _, given = header.partition(" ")
        if scheme.lower() == "bearer" and api_key.matches(given.strip(), self.key):
            await self.app(scope, receive, send)
            return
        err = F.ApiError(401, "Missing or wrong API key: send 'Authorization: Bearer <key>' with the key shown in "
                         "MTP Studio's Local server panel (or given to mtp-studio serve).", code="invalid_api_key")
        path = scope["path"].removeprefix("/v1/").strip("/")
        self.metrics.record(RequestRecord(when=time.time(), endpoint=path if path in ROUTES else "other",
                                          status=401, outcome="unauthorized", stream=False))
        await error_response(err)(scope, receive, send)


class Api:
    """The routes and the state they share (queue, metrics, the engine link)."""

    def __init__(self, link: EngineLink, config: ServerConfig, metrics: Metrics) -> None:
        self.link, self.config, self.metrics = link, config, metrics
        self._gate: Gate | None = None
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
        return await self._generate(request, "chat")

    async def completions(self, request: Request) -> Response:
        return await self._generate(request, "completions")

    async def _generate(self, request: Request, endpoint: str) -> Response:
        try:
            body = await self._read_json(request)
            model = self.link.model()
            if model is None:
                raise F.ApiError(503, "The engine is (re)starting; retry in a few seconds.", type_="server_error",
                                 code="engine_unavailable", headers={"Retry-After": str(self.config.retry_after_s)})
            parse = F.parse_chat if endpoint == "chat" else F.parse_completion
            parsed = parse(body, self.served_ids(), model.n_ctx)
            # everything that can fail is made before the place in line is taken: from admit() on, each
            # path out gives it back (the generation's own endings, or the handlers below)
            gen = Generation(self.link, self.gate, self.config, self.metrics, endpoint, parsed.stream)
            speculative = parsed.speculative or self.link.default_speculative()
            # what this model can run: chained heads draft at most their count; without a head MTP is off
            # and MTP + n-gram is n-gram (the report below then says what ran, not what was asked)
            speculative = speculative.limited_to(model.max_draft if model.can_draft else 0)
            message = P.GenerateRequestMsg(
                id=gen.id, prompt=parsed.prompt, messages=parsed.messages, max_tokens=parsed.max_tokens,
                stop=parsed.stop, speculative=speculative, **parsed.sampling)
            self.gate.admit()
        except F.ApiError as err:
            self._reject(endpoint, err)
            return error_response(err)
        try:  # until the first token (or the end), the answer can still be a proper HTTP error
            first = await _unless_disconnected(request, self._first_event(gen, message), gen)
        except F.ApiError as err:
            gen.status = err.status
            gen.record()
            return error_response(err)
        if first is None:  # the client left
            return Response(status_code=499)
        if parsed.stream:
            return StreamingResponse(self._sse(gen, parsed, first, endpoint), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        result: Response | None = await _unless_disconnected(request, self._collect(gen, first), gen)
        return Response(status_code=499) if result is None else result

    async def _first_event(self, gen: Generation, message: P.GenerateRequestMsg) -> P.Event:
        await gen.start(message)
        while True:
            event = await gen.next_event()
            if isinstance(event, P.TokenEvent) or P.is_final(event):
                if gen.outcome.error is not None and gen.finished:
                    raise _engine_error(gen.outcome.error)
                return event

    async def _collect(self, gen: Generation, first: P.Event) -> Response:
        try:
            while not gen.finished:
                await gen.next_event()
        except F.ApiError as err:
            gen.status = err.status
            gen.record()
            return error_response(err)
        out = gen.outcome
        if out.finish == "error":
            failure = _engine_error(out.error)
            gen.status = failure.status
            gen.record()
            return error_response(failure)
        created, model = F.now(), self.served_ids()[0]
        builder = F.chat_completion if gen.endpoint == "chat" else F.completion
        body = builder(F.new_id("chatcmpl" if gen.endpoint == "chat" else "cmpl"), created, model, out.text,
                       out.finish)
        body.update(self._extras(gen))
        gen.record()
        return JSONResponse(body)

    def _extras(self, gen: Generation) -> dict[str, Any]:
        out = gen.outcome
        prompt_tokens = out.stats.prompt_tokens if out.stats else 0
        extras: dict[str, Any] = {"usage": F.usage(prompt_tokens, out.n_tokens),
                                  "timings": F.timings(out.stats, out.n_tokens)}
        if gen.speculative is not None:
            extras["speculative"] = F.speculative_report(out.stats, gen.speculative)
            if out.notes:
                extras["speculative"]["note"] = " ".join(out.notes)
        return extras

    async def _sse(self, gen: Generation, parsed: F.ParsedRequest, first: P.Event,
                   endpoint: str) -> AsyncIterator[str]:
        rid = F.new_id("chatcmpl" if endpoint == "chat" else "cmpl")
        created, model, usage = F.now(), self.served_ids()[0], parsed.include_usage

        def chunk(text: str | None, finish: str | None) -> str:
            if endpoint == "chat":
                delta = {} if text is None else {"content": text}
                data = F.chat_chunk(rid, created, model, delta, finish, usage)
            else:
                data = F.completion_chunk(rid, created, model, text or "", finish, usage)
            return _sse_data(data)

        try:
            if endpoint == "chat":
                yield _sse_data(F.chat_chunk(rid, created, model, {"role": "assistant", "content": ""}, None, usage))
            events = [first]
            while True:
                # everything that has arrived goes out in one write: fewer wake-ups under load
                text = "".join(chunk(ev.text, None) for ev in events if isinstance(ev, P.TokenEvent) and ev.text)
                if text:
                    yield text
                if gen.finished:
                    break
                events = [await gen.next_event(), *gen.ready_events()]
            out = gen.outcome
            if out.finish == "error":
                yield _sse_data(_engine_error(out.error).body())
            else:
                last = json.loads(chunk(None, out.finish)[len("data: "):])
                last.update({k: v for k, v in self._extras(gen).items() if k != "usage"})
                yield _sse_data(last)
                if usage:
                    yield _sse_data(F.usage_chunk(rid, created, model, endpoint, self._extras(gen)["usage"]))
            yield "data: [DONE]\n\n"
        except F.ApiError as err:  # the timeout, once the stream has begun
            yield _sse_data(err.body())
            yield "data: [DONE]\n\n"
        finally:  # a disconnect cancels this generator: stop the generation in the worker
            if not gen.finished:
                gen.abandon("disconnected")
            else:
                gen.record()

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
        message, code = f"There is no {request.url.path} here; the API is under /v1 (GET /v1/models).", "not_found"
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
    api = Api(link, config, metrics)
    middleware = []
    if config.cors_origins:
        middleware.append(Middleware(CORSMiddleware, allow_origins=list(config.cors_origins),
                                     allow_methods=["GET", "POST", "OPTIONS"],
                                     allow_headers=["Authorization", "Content-Type"]))
    if is_loopback(config.host):
        middleware.insert(0, Middleware(LoopbackHostCheck))
    middleware.append(Middleware(ApiKeyCheck, key=config.api_key, metrics=metrics))
    routes = [
        Route("/health", api.health, methods=["GET"]),
        Route("/metrics", api.metrics_text, methods=["GET"]),
        Route("/v1/models", api.models, methods=["GET"]),
        Route("/v1/models/{model_id:path}", api.model, methods=["GET"]),
        Route("/v1/chat/completions", api.chat, methods=["POST"]),
        Route("/v1/completions", api.completions, methods=["POST"]),
    ]
    app = Starlette(routes=routes, middleware=middleware,
                    exception_handlers={HTTPException: _http_error, Exception: _server_error})
    app.state.api = api
    return app
