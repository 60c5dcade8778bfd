"""The server under load and when things go wrong: a full queue, a client that
leaves mid-stream, a generation past its timeout, a worker that dies.

The worker is paused with SIGSTOP where a test needs a request to stay
running or waiting; nothing here depends on how fast the machine is.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import httpx
import pytest

from engine.server.runner import ServerThread
from tests.server.conftest import MODEL_ID, start_server

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGSTOP"), reason="pauses the worker with SIGSTOP")

LONG = {"model": MODEL_ID, "prompt": "hello world the", "max_tokens": 6000, "temperature": 0, "stream": True}
SHORT = {"model": MODEL_ID, "prompt": "hello world the", "max_tokens": 4, "temperature": 0}


def wait_for(condition: Callable[[], object], seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


@contextmanager
def paused(pid: int) -> Iterator[None]:
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def test_full_queue_is_503_with_retry_after_and_the_queued_request_is_served(server: ServerThread, link):
    url = f"{server.base_url}/completions"
    waiting: list[httpx.Response] = []
    with httpx.stream("POST", url, json=LONG, timeout=60) as running:
        assert running.status_code == 200  # headers come with the first token: it is running
        with paused(link.client.proc.pid):
            queued = threading.Thread(target=lambda: waiting.append(httpx.post(url, json=SHORT, timeout=60)))
            queued.start()
            wait_for(lambda: server.metrics.deferred == 1)
            refused = httpx.post(url, json=SHORT, timeout=10)
            assert refused.status_code == 503 and refused.headers["retry-after"] == "2"
            assert refused.json()["error"]["code"] == "server_busy"
    queued.join(60)
    assert waiting[0].status_code == 200 and waiting[0].json()["usage"]["completion_tokens"] == 4


def test_disconnect_mid_stream_cancels_the_generation_and_the_next_request_is_served(server: ServerThread):
    url = f"{server.base_url}/completions"
    before = len(server.metrics.recent)
    with httpx.stream("POST", url, json=LONG, timeout=60) as stream:
        lines = stream.iter_lines()
        assert next(line for line in lines if line.startswith("data: ")).startswith("data: {")
    wait_for(lambda: any(r.outcome == "disconnected" for r in list(server.metrics.recent)[before:]))
    record = next(r for r in list(server.metrics.recent)[before:] if r.outcome == "disconnected")
    assert record.finish == "cancelled" and 0 < record.completion_tokens < LONG["max_tokens"]
    reply = httpx.post(url, json=SHORT, timeout=60)
    assert reply.status_code == 200 and reply.json()["choices"][0]["finish_reason"] == "length"


def test_generation_past_its_timeout_is_cancelled_with_504(link):
    quick = start_server(link, request_timeout_s=1.0)
    try:
        url = f"{quick.base_url}/completions"
        with paused(link.client.proc.pid):  # the request waits in the worker's pipe past its deadline
            late = httpx.post(url, json={**SHORT, "max_tokens": 50}, timeout=30)
        assert late.status_code == 504 and late.json()["error"]["code"] == "timeout"
        wait_for(lambda: server_idle(quick))
        assert httpx.post(url, json=SHORT, timeout=60).status_code == 200
    finally:
        quick.stop()


def server_idle(server: ServerThread) -> bool:
    return server.metrics.processing == 0 and server.metrics.deferred == 0


def test_worker_crash_is_an_error_in_the_stream_and_a_restarted_worker(server: ServerThread, link):
    url = f"{server.base_url}/completions"
    dead = link.client.proc.pid
    with httpx.stream("POST", url, json=LONG, timeout=60) as stream:
        lines = stream.iter_lines()
        next(line for line in lines if line.startswith("data: {"))
        os.kill(dead, signal.SIGKILL)
        rest = [line for line in lines if line.startswith("data: ")]
    errors = [json.loads(line[6:])["error"] for line in rest if line.startswith('data: {"error"')]
    assert errors and errors[0]["code"] == "worker_died" and rest[-1] == "data: [DONE]"
    health = server.base_url.removesuffix("/v1") + "/health"
    wait_for(lambda: httpx.get(health).status_code == 200, 90)
    assert link.client.proc.pid != dead and link.restarts >= 1
    reply = httpx.post(url, json=SHORT, timeout=60)
    assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 4


def test_a_client_that_gives_up_on_a_whole_reply_cancels_it(server: ServerThread, link):
    url = f"{server.base_url}/completions"
    before = len(server.metrics.recent)
    with paused(link.client.proc.pid):  # the request cannot finish before the client leaves
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(url, json={**LONG, "stream": False}, timeout=httpx.Timeout(60, read=0.5))
    wait_for(lambda: any(r.outcome == "disconnected" for r in list(server.metrics.recent)[before:]))
    record = next(r for r in list(server.metrics.recent)[before:] if r.outcome == "disconnected")
    assert record.finish == "cancelled" and record.completion_tokens < LONG["max_tokens"]
    assert httpx.post(url, json=SHORT, timeout=60).status_code == 200


def test_a_request_that_waits_past_the_queue_timeout_gets_503(link):
    patient = start_server(link, queue_timeout_s=0.5)
    try:
        url = f"{patient.base_url}/completions"
        with httpx.stream("POST", url, json=LONG, timeout=60) as running:
            assert running.status_code == 200
            with paused(link.client.proc.pid):
                late = httpx.post(url, json=SHORT, timeout=30)
        assert late.status_code == 503 and late.json()["error"]["code"] == "queue_timeout"
        assert "retry-after" in late.headers
        wait_for(lambda: server_idle(patient))
    finally:
        patient.stop()


def test_a_stopped_worker_is_reported_unhealthy_and_healthy_again_when_it_runs(server: ServerThread, link):
    health = server.base_url.removesuffix("/v1") + "/health"
    assert httpx.get(health, timeout=10).status_code == 200
    with paused(link.client.proc.pid):
        stalled = httpx.get(health, timeout=10)
        assert stalled.status_code == 503 and "not answered" in stalled.json()["error"]["message"], stalled.text
    wait_for(lambda: httpx.get(health, timeout=10).status_code == 200, 10)
    assert httpx.post(f"{server.base_url}/completions", json=SHORT, timeout=30).status_code == 200
