"""uvicorn's answer to bytes that are not HTTP, in the API's JSON error shape.

A request uvicorn cannot parse never reaches the ASGI app, so Starlette's
error handlers cannot shape it; uvicorn answers it in plain text. This
subclass of the HTTP protocol uvicorn would pick anyway answers it as every
other error here is answered: ``{"error": {message, type, param, code}}``.
"""

from __future__ import annotations

import asyncio
import json

from uvicorn.protocols.http.auto import AutoHTTPProtocol


def _body(reason: str) -> bytes:
    error = {"message": f"The request is not valid HTTP/1.1 ({reason}).", "type": "invalid_request_error",
             "param": None, "code": "invalid_http"}
    return json.dumps({"error": error}).encode("ascii")


class JsonErrorsHTTPProtocol(AutoHTTPProtocol):  # type: ignore[misc, valid-type]
    """The protocol of ``http="auto"`` (httptools where installed, else h11), with a JSON 400."""

    transport: asyncio.Transport

    def send_400_response(self, msg: str) -> None:
        body = _body(msg)
        head = (b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\n"
                b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body))
        self.transport.write(head + body)
        self.transport.close()
