"""Several clients at once against ``serve --parallel 4``: decoded together, each as alone.

A worker whose model holds four sequences behind a server that runs four requests at
once; requests from the official ``openai`` client, from four threads.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from engine.server.engine_link import WorkerLink, load_request_for
from engine.server.runner import ServerThread
from engine.speculative.settings import mtp
from tests.server.conftest import MODEL_ID, start_server

PROMPTS = ["hello world the", "the river model", "a quiet light and", "numbers and words"]


@pytest.fixture(scope="module")
def parallel_link(model_path: str) -> Iterator[WorkerLink]:
    engine = WorkerLink(load_request_for(model_path, n_ctx=2048, n_threads=1, parallel=4), speculative=mtp(3))
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def parallel_server(parallel_link: WorkerLink) -> Iterator[ServerThread]:
    running = start_server(parallel_link, parallel=4, max_queue=4)
    yield running
    running.stop()


def stream(base_url: str, prompt: str, max_tokens: int, marks: dict[str, float] | None = None,
           ready: threading.Barrier | None = None) -> str:
    import openai

    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120)
    if ready is not None:
        ready.wait(60)
    pieces = []
    for chunk in client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=max_tokens, temperature=0,
                                           stream=True):
        if marks is not None:
            marks.setdefault("first", time.monotonic())
            marks["last"] = time.monotonic()
        pieces.append(chunk.choices[0].text if chunk.choices else "")
    return "".join(pieces)


def test_four_streaming_clients_are_served_together_each_as_alone(parallel_server: ServerThread):
    """Each stream long enough (400 tokens, about a second each on this model when four run together)
    that a loaded machine's late thread start cannot pass for serving in line; the clients are built before
    they start, together."""
    alone = [stream(parallel_server.base_url, p, 400) for p in PROMPTS]
    texts: list[str] = [""] * 4
    marks: list[dict[str, float]] = [{} for _ in PROMPTS]
    ready = threading.Barrier(4)

    def client(i: int) -> None:
        texts[i] = stream(parallel_server.base_url, PROMPTS[i], 400, marks[i], ready)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert texts == alone and all(alone)
    # together, not in line: every stream had begun before any had ended
    assert max(m["first"] for m in marks) < min(m["last"] for m in marks)
    metrics = httpx.get(parallel_server.base_url.removesuffix("/v1") + "/metrics", timeout=10).text
    assert "mtpstudio:sequences 4" in metrics
    # acceptance per sequence: the four together drafted in four sequences, and the sequences' counts add up
    # to the totals; the panel's log names each request's sequence
    drafted = _per_sequence(metrics, "draft_tokens_total")
    accepted = _per_sequence(metrics, "draft_tokens_accepted_total")
    assert set(drafted) == {0, 1, 2, 3} and all(n > 0 for n in drafted.values())
    assert sum(drafted.values()) == _value(metrics, "mtpstudio:draft_tokens_total")
    assert sum(accepted.values()) == _value(metrics, "mtpstudio:draft_tokens_accepted_total")
    assert all(accepted[s] <= drafted[s] for s in drafted)
    together = [r.line() for r in list(parallel_server.metrics.recent)[-4:]]
    assert sorted(line.rsplit("sequence ", 1)[1] for line in together) == ["0", "1", "2", "3"]


def _value(metrics: str, name: str) -> float:
    return next(float(line.split()[-1]) for line in metrics.splitlines() if line.startswith(name + " "))


def _per_sequence(metrics: str, name: str) -> dict[int, float]:
    """``mtpstudio:sequence_<name>{sequence="k"} v`` lines, by sequence."""
    prefix = f'mtpstudio:sequence_{name}{{sequence="'
    return {int(line[len(prefix):].split('"')[0]): float(line.split()[-1])
            for line in metrics.splitlines() if line.startswith(prefix)}


def test_a_worker_crash_with_four_running_fails_all_four_and_the_next_requests_are_served(
        parallel_server: ServerThread, parallel_link: WorkerLink):
    url = f"{parallel_server.base_url}/completions"
    dead = parallel_link.client.proc.pid
    errors: list[list[dict]] = [[] for _ in range(4)]
    started = threading.Barrier(5)

    def client(i: int) -> None:
        body = {"model": MODEL_ID, "prompt": PROMPTS[i], "max_tokens": 6000, "temperature": 0, "stream": True}
        with httpx.stream("POST", url, json=body, timeout=120) as response:
            lines = response.iter_lines()
            next(line for line in lines if line.startswith("data: "))  # it is running
            started.wait(60)
            errors[i] = [json.loads(line[6:])["error"] for line in lines if line.startswith('data: {"error"')]

    threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    started.wait(60)
    os.kill(dead, signal.SIGKILL)
    for t in threads:
        t.join(120)
    assert all(e and e[0]["code"] == "worker_died" for e in errors), errors
    health = parallel_server.base_url.removesuffix("/v1") + "/health"
    deadline = time.monotonic() + 90
    while httpx.get(health).status_code != 200:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert parallel_link.client.proc.pid != dead
    replies = [httpx.post(url, json={"model": MODEL_ID, "prompt": p, "max_tokens": 4, "temperature": 0}, timeout=60)
               for p in PROMPTS[:2]]
    assert [r.json()["usage"]["completion_tokens"] for r in replies] == [4, 4]


def test_a_request_gets_the_profiles_choice_for_the_generations_running_as_it_starts(parallel_server, parallel_link):
    """An autotune profile measured at several concurrencies (engine/autotune/concurrency.py): a request
    that does not choose gets the choice for as many generations as run when it starts, itself included."""
    from engine.speculative.settings import SPECULATION_OFF

    def mode(body: dict) -> str:
        reply = httpx.post(f"{parallel_server.base_url}/completions", json=body, timeout=120)
        assert reply.status_code == 200, reply.text
        return reply.json()["speculative"]["mode"]

    one = {"model": MODEL_ID, "prompt": PROMPTS[1], "max_tokens": 8, "temperature": 0}
    parallel_link.set_default_speculative(mtp(3), by_concurrency=lambda n: mtp(3) if n == 1 else SPECULATION_OFF)
    try:
        assert mode(one) == "mtp"  # alone
        started = threading.Event()

        def long_stream() -> None:
            body = {**one, "prompt": PROMPTS[0], "max_tokens": 400, "stream": True}
            with httpx.stream("POST", f"{parallel_server.base_url}/completions", json=body, timeout=120) as r:
                for _ in r.iter_lines():
                    started.set()

        runner = threading.Thread(target=long_stream)
        runner.start()
        assert started.wait(60)
        assert mode(one) == "off"  # beside a running one
        runner.join(120)
        assert mode(one) == "mtp"  # alone again
    finally:
        parallel_link.set_default_speculative(mtp(3))


def test_requests_sent_together_with_one_system_prompt_read_it_once(parallel_server: ServerThread):
    """Three clients at once whose prompts begin with one long preamble (an agent's system prompt): one
    request reads it, the others share what it read (``cached_tokens``), and each reply is the one it gets
    alone."""
    import openai

    system = "You are a careful writer of short notes about rivers, mills, bridges and the weather. " * 4
    prompts = [system + tail for tail in ("First:", "Second:", "Third:")]
    client = openai.OpenAI(base_url=parallel_server.base_url, api_key="unused", max_retries=0, timeout=120)
    answers: list[object] = [None] * 3
    start = threading.Barrier(3)

    def ask(i: int) -> None:
        start.wait()
        answers[i] = client.completions.create(model=MODEL_ID, prompt=prompts[i], max_tokens=8, temperature=0)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    cached = sorted(a.usage.prompt_tokens_details.cached_tokens for a in answers)  # type: ignore[attr-defined]
    assert cached[0] < 20 and cached[1] >= len(system) - 20 and cached[2] >= len(system) - 20, cached
    alone = [client.completions.create(model=MODEL_ID, prompt=p, max_tokens=8, temperature=0) for p in prompts]
    assert [a.choices[0].text for a in answers] == [a.choices[0].text for a in alone]  # type: ignore[attr-defined]
