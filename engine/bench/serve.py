"""``mtp-studio serve-bench``: what the HTTP server costs and how it holds up.

One run, one model, one worker:
1. **Overhead**: the same greedy requests, one at a time, alternately sent to
   the worker directly (the server's own engine link, no HTTP) and through
   the server as streaming HTTP requests; the median time of each, and the
   server's overhead as a percentage of the direct time. Greedy decoding
   makes both produce the same tokens, which the run checks.
2. **Load**: N concurrent streaming clients, each sending its requests back to
   back; total tokens per second over the wall time, and time to first token
   (p50, p95) as the clients see it, queueing included.

The HTTP clients are the standard library's ``http.client``, in threads of a
child process (as real clients are other processes).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import queue
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from engine.bench.child import JsonChild
from engine.worker import protocol as P

PROMPTS = ["The history of the river valley", "A letter about the rain", "Notes on building a small boat",
           "Why the cloud came back", "The window and the old letter"]


def register(sub: argparse._SubParsersAction) -> None:
    from engine.server.cli import add_model_args

    p = sub.add_parser("serve-bench", help="benchmark the OpenAI-compatible server against the worker directly")
    add_model_args(p)
    p.add_argument("--clients", type=int, default=4, help="concurrent streaming clients in the load test")
    p.add_argument("--requests", type=int, default=4, help="requests per client in the load test")
    p.add_argument("--pairs", type=int, default=6, help="direct/HTTP request pairs in the overhead test")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.set_defaults(func=cmd_bench)


def _direct(link: Any, prompt: str, max_tokens: int) -> tuple[float, str, int]:
    """One greedy generation through the engine link, no HTTP: seconds, text, tokens."""
    events: queue.Queue[P.Event] = queue.Queue()
    request = P.GenerateRequestMsg(id=link.new_id(), prompt=prompt, max_tokens=max_tokens,  # SamplingParams(): greedy
                                   speculative=link.default_speculative())
    t0 = time.perf_counter()
    link.submit(request, events.put)
    text, n = "", 0
    while True:
        ev = events.get(timeout=600)
        if isinstance(ev, P.TokenEvent):
            text += ev.text
        if P.is_final(ev):
            n = ev.n_tokens if isinstance(ev, P.DoneEvent) else 0
            return time.perf_counter() - t0, text, n


def _http(port: int, model: str, prompt: str, max_tokens: int) -> tuple[float, float, str, int]:
    """One streaming completion over HTTP: seconds, time to first token, text, tokens (from usage)."""
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                       "stream": True, "stream_options": {"include_usage": True}})
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:300]!r}")
    ttft, text, n = None, "", 0
    for raw in resp:
        line = raw.decode("utf-8").strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        data = json.loads(line[6:])
        for choice in data.get("choices", []):
            if choice.get("text"):
                ttft = ttft if ttft is not None else time.perf_counter() - t0
                text += choice["text"]
        if data.get("usage"):
            n = data["usage"]["completion_tokens"]
    conn.close()
    return time.perf_counter() - t0, ttft or 0.0, text, n


class _ClientProcess(JsonChild):
    """The HTTP clients' child process (engine/bench/child.py), for one server and model."""

    def __init__(self, port: int, model: str) -> None:
        super().__init__("engine.bench.serve")
        self.port, self.model = port, model

    def ask(self, command: dict[str, Any]) -> dict[str, Any]:
        return super().ask({**command, "port": self.port, "model": self.model})


def _client_main() -> None:
    """The child: one JSON command per line in, one JSON answer per line out."""
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "one":
            seconds, ttft, text, n = _http(cmd["port"], cmd["model"], cmd["prompt"], cmd["max_tokens"])
            answer: dict[str, Any] = {"seconds": seconds, "ttft": ttft, "text": text, "tokens": n}
        else:
            results: list[tuple[float, float, int]] = []
            lock = threading.Lock()

            def client(k: int, cmd: dict[str, Any] = cmd, results: list[tuple[float, float, int]] = results,
                       lock: threading.Lock = lock) -> None:
                for j in range(cmd["requests"]):
                    seconds, ttft, _text, n = _http(cmd["port"], cmd["model"], PROMPTS[(k + j) % len(PROMPTS)],
                                                    cmd["max_tokens"])
                    with lock:
                        results.append((seconds, ttft, n))

            t0 = time.perf_counter()
            threads = [threading.Thread(target=client, args=(k,)) for k in range(cmd["clients"])]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            answer = {"results": results, "wall": time.perf_counter() - t0}
        print(json.dumps(answer), flush=True)


class _CpuMeter:
    """CPU time per path, which other load on the machine barely moves (unlike wall time): the engine's
    (the worker process), this process's (direct: the engine link; HTTP: the link and the server), and
    the client process's. The server's own cost is this process's CPU through HTTP minus directly."""

    def __init__(self, worker_pid: int, client_pid: int) -> None:
        import psutil

        self.worker, self.client = psutil.Process(worker_pid), psutil.Process(client_pid)
        self.totals: dict[str, list[float]] = {"direct": [0.0, 0.0, 0.0], "http": [0.0, 0.0, 0.0]}

    def _now(self) -> tuple[float, float, float]:
        def cpu(p: Any) -> float:
            t = p.cpu_times()
            return float(t.user + t.system)

        return cpu(self.worker), time.process_time(), cpu(self.client)

    @contextlib.contextmanager
    def measure(self, path: str) -> Iterator[None]:
        before = self._now()
        yield
        after = self._now()
        for i in range(3):
            self.totals[path][i] += after[i] - before[i]

    def figures(self, n: int) -> dict[str, float]:
        engine = (self.totals["direct"][0] + self.totals["http"][0]) / (2 * n) * 1000
        server = (self.totals["http"][1] - self.totals["direct"][1]) / n * 1000
        return {"engine_cpu_ms": engine, "server_cpu_ms": server, "server_cpu_pct": server / engine * 100,
                "client_cpu_ms": self.totals["http"][2] / n * 1000}


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def cmd_bench(args: argparse.Namespace) -> int:
    from engine.server.cli import start_link
    from engine.server.config import ServerConfig
    from engine.server.runner import ServerThread

    link, line = start_link(args)
    server = ServerThread(link, ServerConfig(port=0, max_queue=args.clients * args.requests))  # type: ignore[arg-type]
    server.start()
    model = link.model()  # type: ignore[attr-defined]
    model_id = model.path.rsplit("/", 1)[-1].removesuffix(".gguf")
    try:
        clients = _ClientProcess(server.port, model_id)
        _direct(link, "warm up", 8)
        clients.ask({"op": "one", "prompt": "warm up", "max_tokens": 8})
        direct_s, http_s, mismatches = [], [], 0
        cpu = _CpuMeter(link.client.proc.pid, clients.proc.pid)  # type: ignore[attr-defined]
        for i in range(args.pairs):
            prompt = PROMPTS[i % len(PROMPTS)]
            with cpu.measure("direct"):
                d = _direct(link, prompt, args.max_tokens)
            with cpu.measure("http"):
                h = clients.ask({"op": "one", "prompt": prompt, "max_tokens": args.max_tokens})
            direct_s.append(d[0])
            http_s.append(h["seconds"])
            mismatches += d[1] != h["text"] or d[2] != h["tokens"]
        load = clients.ask({"op": "load", "clients": args.clients, "requests": args.requests,
                            "max_tokens": args.max_tokens})
        results: list[tuple[float, float, int]] = [tuple(r) for r in load["results"]]  # type: ignore[misc]
        wall = load["wall"]
        clients.close()
    finally:
        server.stop()
        link.close()  # type: ignore[attr-defined]
    d_med, h_med = statistics.median(direct_s), statistics.median(http_s)
    ttfts = [r[1] for r in results]
    figures = {
        "model": model.path, "speculative": line, "max_tokens": args.max_tokens,
        "direct_median_s": d_med, "http_median_s": h_med, "overhead_pct": (h_med - d_med) / d_med * 100,
        "overhead_ms": (h_med - d_med) * 1000,
        "outputs_identical": mismatches == 0, "clients": args.clients, "requests": len(results),
        "total_tokens": sum(r[2] for r in results), "wall_s": wall,
        "total_tps": sum(r[2] for r in results) / wall,
        "ttft_p50_s": _percentile(ttfts, 0.5), "ttft_p95_s": _percentile(ttfts, 0.95),
        **cpu.figures(args.pairs),
    }
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        print(f"model {model.path}; {line}; {args.max_tokens} tokens per request")
        print(f"overhead: direct {d_med * 1000:.1f} ms, HTTP stream {h_med * 1000:.1f} ms (medians of "
              f"{args.pairs}): {figures['overhead_pct']:+.1f} % ({(h_med - d_med) * 1000:+.1f} ms per request); "
              f"outputs identical: {mismatches == 0}")
        print(f"CPU per request: engine {figures['engine_cpu_ms']:.1f} ms; the server's own "
              f"{figures['server_cpu_ms']:.1f} ms = {figures['server_cpu_pct']:.1f} % of the engine's "
              f"(the HTTP client: {figures['client_cpu_ms']:.1f} ms)")
        print(f"load: {args.clients} clients x {args.requests} requests: {figures['total_tokens']} tokens in "
              f"{wall:.2f} s = {figures['total_tps']:.1f} tok/s; time to first token p50 "
              f"{figures['ttft_p50_s'] * 1000:.0f} ms, p95 {figures['ttft_p95_s'] * 1000:.0f} ms")
    return 0 if mismatches == 0 else 1


if __name__ == "__main__":
    _client_main()
