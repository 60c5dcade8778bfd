"""The server's guards: the API key, loopback by default, CORS off unless allowed, and keys kept out of logs."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import openai
import pytest

from engine.server import api_key
from engine.server.config import ConfigError, ServerConfig, check
from engine.server.runner import ServerThread
from tests.server.conftest import MODEL_ID, start_server

KEY = api_key.generate()
ORIGIN = "http://localhost:3000"


@pytest.fixture(scope="module")
def keyed(link) -> Iterator[ServerThread]:
    running = start_server(link, api_key=KEY, cors_origins=(ORIGIN,))
    yield running
    running.stop()


def ask(server: ServerThread, key: str) -> object:
    client = openai.OpenAI(base_url=server.base_url, api_key=key, max_retries=0, timeout=60)
    return client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "hi"}],
                                          max_tokens=4, temperature=0)


def test_a_request_without_the_key_is_401_and_with_it_is_served(keyed):
    with pytest.raises(openai.AuthenticationError) as caught:
        ask(keyed, "wrong-key-123")
    assert caught.value.status_code == 401 and caught.value.body["code"] == "invalid_api_key"
    assert KEY not in str(caught.value.body)
    assert httpx.get(f"{keyed.base_url}/models").status_code == 401  # no header at all
    assert ask(keyed, KEY).usage.completion_tokens == 4
    assert httpx.get(keyed.base_url.removesuffix("/v1") + "/health").status_code == 200  # health needs no key


def test_the_request_log_never_holds_the_key_or_the_prompt(keyed):
    ask(keyed, KEY)
    assert httpx.get(f"{keyed.base_url}/models", headers={"Authorization": "Bearer not-the-key"}).status_code == 401
    assert keyed.metrics.recent[-1].outcome == "unauthorized"  # the log shows refused calls, not what they sent
    assert keyed.metrics.recent and all(KEY not in r.line() and "hi" not in r.line().split()
                                        for r in keyed.metrics.recent)
    assert KEY not in keyed.metrics.prometheus()


def test_other_addresses_need_a_key_and_loopback_is_the_default():
    assert ServerConfig().host == "127.0.0.1"
    with pytest.raises(ConfigError, match="API key"):
        check(ServerConfig(host="0.0.0.0"))
    check(ServerConfig(host="0.0.0.0", api_key=KEY))
    check(ServerConfig(host="::1"))  # loopback v6 needs none
    with pytest.raises(ConfigError, match="8 printable"):
        check(ServerConfig(api_key="short"))


def test_keys_compare_in_constant_time_and_are_random():
    assert api_key.matches(KEY, KEY) and not api_key.matches(KEY, KEY[:-1] + "x") and not api_key.matches("", KEY)
    assert api_key.generate() != api_key.generate() and len(KEY) > 40


def test_cors_answers_only_the_allowed_origin(keyed, server):
    url = f"{keyed.base_url}/chat/completions"
    preflight = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization"}
    allowed = httpx.options(url, headers={"Origin": ORIGIN, **preflight})
    assert allowed.status_code == 200 and allowed.headers["access-control-allow-origin"] == ORIGIN
    other = httpx.options(url, headers={"Origin": "http://evil.example", **preflight})
    assert "access-control-allow-origin" not in other.headers
    default = httpx.get(f"{server.base_url}/models", headers={"Origin": ORIGIN})  # CORS off by default
    assert default.status_code == 200 and "access-control-allow-origin" not in default.headers


def test_a_web_page_cannot_use_the_keyless_loopback_server(server):
    """No key on 127.0.0.1 is safe only if a browser cannot reach in: a page may POST text/plain without a
    CORS preflight (415 here), or point its own DNS name at 127.0.0.1 (that Host gets 421)."""
    url = f"{server.base_url}/chat/completions"
    body = json.dumps({"model": MODEL_ID, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    simple = httpx.post(url, content=body, headers={"Content-Type": "text/plain"})
    assert simple.status_code == 415 and simple.json()["error"]["code"] == "unsupported_media_type"
    rebound = httpx.get(f"{server.base_url}/models", headers={"Host": "attacker.example:8181"})
    assert rebound.status_code == 421
    port = server.base_url.split(":")[2].split("/")[0]
    for host in (f"127.0.0.1:{port}", f"localhost:{port}"):
        assert httpx.get(f"{server.base_url}/models", headers={"Host": host}).status_code == 200
    assert httpx.post(url, content=body, headers={"Content-Type": "application/json"}).status_code == 200


def test_cors_for_every_origin_needs_a_key():
    with pytest.raises(ConfigError, match="every web page"):
        check(ServerConfig(cors_origins=("*",)))
    check(ServerConfig(cors_origins=("*",), api_key=KEY))


def test_a_host_that_only_begins_like_a_loopback_name_is_refused(server):
    """``[::1]evil.example`` and ``127.0.0.1:P@evil.example`` are other names (a browser would send them for
    pages of their own); only a loopback name with at most a numeric port passes."""
    port = server.base_url.split(":")[2].split("/")[0]
    for host in ("[::1]evil.example", f"127.0.0.1:{port}@evil.example", f"localhost:{port}@evil.example",
                 "[::1]:8181evil.example", f"127.0.0.1:{port}:80", "localhost.evil.example", "127.0.0.1@evil"):
        answer = httpx.get(f"{server.base_url}/models", headers={"Host": host})
        assert answer.status_code == 421 and answer.json()["error"]["code"] == "wrong_host", host
    for host in (f"[::1]:{port}", "[::1]", "127.0.0.1", f"LOCALHOST:{port}"):
        assert httpx.get(f"{server.base_url}/models", headers={"Host": host}).status_code == 200, host
