"""Connection deadlines and the connection limit (issue 31, item 5), over real
sockets on loopback against the real server: a silent connection, a header a
byte at a time, a chunked body that never ends, and more connections than the
limit. Each must end in bounded time, and the server must still serve."""

from __future__ import annotations

import json
import logging
import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from engine.server.runner import ServerThread
from tests.server.conftest import start_server

HEAD_S, BODY_S, LIMIT = 1.5, 2.0, 8
SLACK_S = 3.0  # a busy shared machine's delay on top of a deadline


@pytest.fixture(scope="module")
def tight(link) -> Iterator[ServerThread]:
    running = start_server(link, header_timeout_s=HEAD_S, body_timeout_s=BODY_S, max_connections=LIMIT)
    yield running
    running.stop()


def connect(server: ServerThread) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    return sock


def answer(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:  # closed with the client's bytes unread: TCP resets after what it sent
        pass
    return data


def error_code(raw: bytes) -> tuple[int, str]:
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)["error"]["code"]


def still_serves(server: ServerThread) -> None:
    assert httpx.get(f"{server.base_url}/models", timeout=30).status_code == 200


def test_a_connection_that_sends_nothing_gets_408_and_is_closed(tight):
    started = time.monotonic()
    with connect(tight) as sock:
        raw = answer(sock)
    assert error_code(raw) == (408, "request_timeout")
    assert HEAD_S - 0.2 <= time.monotonic() - started < HEAD_S + SLACK_S
    still_serves(tight)


def test_a_header_sent_a_byte_at_a_time_is_cut_off_at_the_head_deadline(tight):
    started = time.monotonic()
    with connect(tight) as sock:
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        sock.settimeout(0.5)
        closed = False
        for byte in b"X-Slow: " + b"a" * 100:  # a byte every 0.5 s: each would restart an idle timer
            try:
                sock.send(bytes([byte]))
                data = sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                closed = True
                break
            if data:
                assert error_code(data + answer(sock)) == (408, "request_timeout")
                closed = True
                break
        assert closed
    assert time.monotonic() - started < HEAD_S + SLACK_S
    still_serves(tight)


def test_a_chunked_body_that_never_ends_is_cut_off_at_the_body_deadline(tight):
    started = time.monotonic()
    with connect(tight) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n1\r\n{\r\n")
        sock.settimeout(0.3)
        raw = b""
        while time.monotonic() - started < BODY_S + SLACK_S + 5:
            try:
                sock.send(b"1\r\n \r\n")  # a space a time: the body never ends
                chunk = sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                break
            if not chunk:
                break
            raw += chunk
    elapsed = time.monotonic() - started
    assert BODY_S - 0.2 <= elapsed < BODY_S + SLACK_S
    assert error_code(raw) == (408, "request_timeout")
    still_serves(tight)


@pytest.fixture()
def crowded(link) -> Iterator[ServerThread]:
    """Deadlines long enough that the held connections stay until the test closes them."""
    running = start_server(link, header_timeout_s=120, max_connections=LIMIT)
    yield running
    running.stop()


def test_beyond_the_connection_limit_quick_503s_logged_once_per_burst(crowded, caplog):
    tight = crowded
    caplog.set_level(logging.WARNING, logger="engine.server")
    held = [connect(tight) for _ in range(LIMIT)]
    try:
        time.sleep(0.3)  # all accepted
        for _ in range(2):  # two rounds of refusals in one burst
            refused = []
            for _ in range(12):
                started = time.monotonic()
                with connect(tight) as sock:
                    raw = answer(sock)
                refused.append(time.monotonic() - started)
                status, code = error_code(raw)
                assert (status, code) == (503, "too_many_connections") and b"retry-after: 2" in raw
            assert max(refused) < 1.0  # at once, not after any deadline
    finally:
        for sock in held:
            sock.close()
    time.sleep(0.5)
    lines = [r.getMessage() for r in caplog.records if r.name == "engine.server"]
    assert len(lines) == 2, lines  # one when the burst began, one when it ended
    assert "new ones get 503" in lines[0] and "24 connection(s) were refused" in lines[1]
    still_serves(tight)
