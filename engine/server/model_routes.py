"""The routes that describe the loaded model or its vocabulary and generate nothing: llama-server's
``/tokenize`` and ``/detokenize``, and Ollama's ``/api/tags``, ``/api/ps``, ``/api/show``,
``/api/version`` and ``GET /``. A mixin of :class:`~engine.server.app.Api`, which owns the state
they read (the engine link, the config, the loaded model)."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from engine.server import ollama_format as O
from engine.server import openai_format as F
from engine.server.engine_link import EngineUnavailable
from engine.server.generation import engine_error
from engine.worker import protocol as P


class ModelRoutes:
    link: Any
    config: Any

    def loaded(self) -> P.ModelInfo: ...  # Api's

    def served_ids(self) -> tuple[str, ...]: ...  # Api's

    async def _read_json(self, request: Request) -> Any: ...  # Api's

    async def tokenize(self, request: Request) -> Response:
        """llama-server's ``/tokenize``: ``{"content", "add_special", "with_pieces"}`` -> ``{"tokens"}``."""
        try:
            body = await self._read_json(request)
            F.check_text(body)
            content = body.get("content") if isinstance(body, dict) else None
            if not isinstance(content, str):
                raise F.bad("content", "'content' must be the text to tokenize", "invalid_type")
            add_special, pieces = body.get("add_special", False), body.get("with_pieces", False)
            if not isinstance(add_special, bool) or not isinstance(pieces, bool):
                raise F.bad("add_special", "'add_special' and 'with_pieces' must be true or false", "invalid_type")
            answer = await self.tokens(P.TokenizeRequest(id=self.link.new_id(), text=content,
                                                         add_special=add_special))
        except F.ApiError as err:
            return JSONResponse(err.body(), status_code=err.status, headers=err.headers)
        if pieces:
            return JSONResponse({"tokens": [{"id": t, "piece": p} for t, p in zip(answer.tokens, answer.pieces,
                                                                                   strict=True)]})
        return JSONResponse({"tokens": answer.tokens})

    async def detokenize(self, request: Request) -> Response:
        """llama-server's ``/detokenize``: ``{"tokens": [...]}`` -> ``{"content"}``."""
        try:
            body = await self._read_json(request)
            tokens = body.get("tokens") if isinstance(body, dict) else None
            if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool)
                                                       for t in tokens):
                raise F.bad("tokens", "'tokens' must be a list of token ids", "invalid_type")
            answer = await self.tokens(P.TokenizeRequest(id=self.link.new_id(), tokens=tokens))
        except F.ApiError as err:
            return JSONResponse(err.body(), status_code=err.status, headers=err.headers)
        return JSONResponse({"content": answer.text})

    async def tokens(self, message: P.TokenizeRequest) -> P.TokensEvent:
        """Ask the worker to tokenize (or detokenize); it answers after the generation it is running.

        Raises:
            ApiError: no engine (503), a bad token id (400), or no answer before the request timeout (504).
        """
        self.loaded()
        loop = asyncio.get_running_loop()
        answered: asyncio.Future[P.Event] = loop.create_future()

        def sink(event: P.Event) -> None:
            if P.is_final(event):
                loop.call_soon_threadsafe(lambda: answered.done() or answered.set_result(event))

        try:
            self.link.submit(message, sink)
        except EngineUnavailable as exc:
            raise F.ApiError(503, str(exc), code="engine_unavailable", type_="server_error",
                             headers={"Retry-After": str(self.config.retry_after_s)}) from None
        try:
            event = await asyncio.wait_for(answered, self.config.request_timeout_s)
        except TimeoutError:
            raise F.ApiError(504, "The engine did not answer in time.", code="timeout", type_="server_error") from None
        if not isinstance(event, P.TokensEvent):
            raise engine_error(event if isinstance(event, P.ErrorEvent) else None)
        return event

    def _facts(self) -> dict[str, Any]:
        model = self.loaded()
        path = Path(model.path)
        try:
            modified = path.stat().st_mtime
        except OSError:
            modified = 0.0
        return {"path": model.path, "size": model.size_bytes, "modified": modified,
                "architecture": model.architecture, "n_params": model.n_params,
                "quantization": _quantization(model.description)}

    async def ollama_tags(self, request: Request) -> Response:
        try:
            return JSONResponse(O.tags_body(self.served_ids()[0], **self._facts()))
        except F.ApiError as err:
            return JSONResponse(O.error_body(err), status_code=err.status, headers=err.headers)

    async def ollama_ps(self, request: Request) -> Response:
        try:
            return JSONResponse(O.ps_body(self.served_ids()[0], **self._facts(), n_ctx=self.loaded().n_ctx))
        except F.ApiError as err:
            return JSONResponse(O.error_body(err), status_code=err.status, headers=err.headers)

    async def ollama_show(self, request: Request) -> Response:
        try:
            body = await self._read_json(request)
            O.parse_show(body, self.served_ids(), strict_model=self.config.strict_model)
            model, facts = self.loaded(), self._facts()
        except F.ApiError as err:
            return JSONResponse(O.error_body(err), status_code=err.status, headers=err.headers)
        capabilities = ("completion", "tools") if model.has_chat_template or model.tool_syntax else ("completion",)
        if model.vision:  # Ollama's clients offer images only to a model that says it takes them
            capabilities += ("vision",)
        return JSONResponse(O.show_body(architecture=facts["architecture"], n_ctx=model.n_ctx,
                                        n_params=facts["n_params"], quantization=facts["quantization"],
                                        modified=facts["modified"], capabilities=capabilities))

    async def ollama_version(self, request: Request) -> Response:
        return JSONResponse(O.version_body())

    async def root(self, request: Request) -> Response:
        """``GET /``: Ollama's clients check that something answers here."""
        return PlainTextResponse("MTP Studio is running (OpenAI, Anthropic and Ollama APIs).")


def _quantization(description: str) -> str | None:
    """The quantization llama.cpp names in a model's description ("glm4moe 1B Q8_0" -> "Q8_0")."""
    last = description.split()[-1] if description.split() else ""
    return last if re.fullmatch(r"(I?Q\d\w*|F16|BF16|F32|MXFP4\w*)", last, flags=re.I) else None
