"""Requests that once broke the server for everyone after them (issue 31):
text that is not Unicode, values of the wrong shape, a submit that fails,
and routes that do not exist. Each is an OpenAI-style JSON error, and the
good request sent right after it is served: nothing stays held.
"""

from __future__ import annotations

import json

import httpx
import pytest

from engine.server.runner import ServerThread
from tests.server.conftest import MODEL_ID

CHAT = {"model": MODEL_ID, "messages": [{"role": "user", "content": "hello world the"}], "max_tokens": 3,
        "temperature": 0}
COMPLETION = {"model": MODEL_ID, "prompt": "hello world the", "max_tokens": 3, "temperature": 0}
SURROGATE = "\ud800"


def raw_post(server: ServerThread, route: str, body: dict[str, object], timeout: float = 30) -> httpx.Response:
    """POST ``body`` as JSON with every non-ASCII character escaped, as a client would send a lone surrogate
    (``"\\ud800"``): httpx's own encoder would refuse to send it."""
    return httpx.post(f"{server.base_url}/{route}", content=json.dumps(body).encode("ascii"),
                      headers={"Content-Type": "application/json"}, timeout=timeout)


def assert_served(server: ServerThread) -> None:
    """A good request is answered now, not after a timeout: the bad one before it gave back its turn."""
    good = raw_post(server, "chat/completions", CHAT, timeout=30)
    assert good.status_code == 200, good.text
    assert good.json()["usage"]["completion_tokens"] == 3
    assert server.metrics.processing == 0 and server.metrics.deferred == 0


@pytest.mark.parametrize(("route", "body", "param"), [
    ("completions", {**COMPLETION, "prompt": f"a{SURROGATE}b"}, "prompt"),
    ("chat/completions", {**CHAT, "messages": [{"role": "user", "content": f"hi {SURROGATE}"}]}, "messages"),
    ("chat/completions", {**CHAT, "messages": [{"role": "user", "content": [{"type": "text",
                                                                            "text": SURROGATE}]}]}, "messages"),
    ("chat/completions", {**CHAT, "stop": ["ok", f"x{SURROGATE}"]}, "stop"),
    ("completions", {**COMPLETION, "stop": SURROGATE}, "stop"),
    ("chat/completions", {**CHAT, "model": f"{MODEL_ID}{SURROGATE}"}, "model"),
    ("chat/completions", {**CHAT, f"temperature{SURROGATE}": 1}, "temperature\\ud800"),
    ("chat/completions", {**CHAT, "user": SURROGATE}, "user"),
], ids=["prompt", "content", "content-part", "stop-list", "stop", "model", "parameter-name", "inert-field"])
def test_text_that_is_not_unicode_is_a_400_naming_the_field_and_the_next_request_is_served(
        server: ServerThread, route, body, param):
    answer = raw_post(server, route, body)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert (error["param"], error["code"], error["type"]) == (param, "invalid_text", "invalid_request_error")
    assert "lone surrogate" in error["message"] and "\\ud800" in error["message"]
    assert_served(server)


@pytest.mark.parametrize("role", [["user"], {"user": 1}, 7, None])
def test_a_role_that_is_not_a_string_is_a_400(server: ServerThread, role):
    answer = raw_post(server, "chat/completions", {**CHAT, "messages": [{"role": role, "content": "hi"}]})
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "messages", answer.text
    assert_served(server)


def test_a_submit_that_fails_unexpectedly_is_a_json_500_and_gives_back_the_turn(server: ServerThread, link,
                                                                              monkeypatch):
    """The last guard: whatever the engine link raises (here a bug, injected once into the real link),
    the request's place in line and its turn are given back."""
    real_submit = link.submit
    calls = []

    def failing_once(request, sink):
        calls.append(request.id)
        if len(calls) == 1:
            raise RuntimeError("injected")
        real_submit(request, sink)

    monkeypatch.setattr(link, "submit", failing_once)
    answer = raw_post(server, "completions", COMPLETION)
    assert answer.status_code == 500, answer.text
    assert answer.json()["error"]["code"] == "internal_error" and "RuntimeError" in answer.json()["error"]["message"]
    assert calls[0] not in link._sinks  # the request id is not left taken
    assert_served(server)


def test_no_such_route_or_method_is_an_openai_style_json_error(server: ServerThread):
    root = server.base_url.removesuffix("/v1")
    missing = httpx.get(f"{root}/v2/chat", timeout=10)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found", missing.text
    assert missing.headers["content-type"] == "application/json"
    wrong = httpx.get(f"{server.base_url}/chat/completions", timeout=10)
    assert wrong.status_code == 405 and wrong.json()["error"]["code"] == "method_not_allowed", wrong.text
    assert "POST" in wrong.headers["allow"]
    assert httpx.get(f"{root}/v1/models/{MODEL_ID}%ED%A0%80", timeout=10).status_code == 404  # not UTF-8



def test_bytes_that_are_not_http_get_a_json_400(server: ServerThread):
    import socket

    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"NOT HTTP AT ALL\x00\r\n\r\n")
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400") and b"application/json" in head, answer
    assert json.loads(body)["error"]["code"] == "invalid_http"
    assert_served(server)
