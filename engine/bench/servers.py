"""The two servers the comparison benchmarks talk to, as child processes on
loopback: ours (``mtp-studio serve``) and llama.cpp's own ``llama-server``
built from the same patched source (``packaging/build_reference_driver.py
--server``). Both are asked the same way (streamed ``/v1/completions``,
greedy), so the figures differ by the servers and nothing else.

Used by ``bench-concurrency`` (engine/bench/concurrency.py) and
``bench-conversation --llama-server`` (engine/bench/conversation.py).
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

READY_TIMEOUT_S = 300.0  # a 1.2 GB model loads in seconds; a cold page cache on a busy machine takes longer


@dataclass(frozen=True)
class ServerSpec:
    """What to start: which server, the model, sequences, per-sequence context, threads, MTP depth (0: off)."""

    engine: str  # "ours" | "llama-server"
    model: str
    parallel: int = 1
    n_ctx: int = 2048  # per sequence, for both servers
    threads: int = 1
    n_max: int = 0
    adaptive: bool = False  # ours only: choose each round's depth (at most n_max)
    draft_vocab: int = 0  # ours only: the MTP head drafts among token ids below this (0: all)
    binary: str = ""  # llama-server's path
    extra: tuple[str, ...] = ()  # more llama-server arguments, as given
    swa_full: bool = False  # both: a sliding-window model keeps every cell of its windowed layers
    # both: one pool of cells for every sequence (True) or a pool each (False); None: each server's default
    # (ours one pool, llama-server with --parallel N a pool each)
    kv_unified: bool | None = None

    @property
    def pool_flags(self) -> tuple[str, ...]:
        """The flags that ask this server for :attr:`kv_unified` (none where it is the server's default)."""
        if self.kv_unified is None:
            return ()
        if self.engine == "ours":
            return () if self.kv_unified else ("--no-kv-unified",)
        return ("--kv-unified",) if self.kv_unified else ()

    @property
    def label(self) -> str:
        mtp = (f"MTP n_max {self.n_max}{' adaptive' if self.adaptive else ''}"
               f"{f' draft vocab {self.draft_vocab:,}' if self.draft_vocab else ''}" if self.n_max else "MTP off")
        flags = (*(("--swa-full",) if self.swa_full else ()), *self.pool_flags, *self.extra)
        return f"{self.engine}{' ' + ' '.join(flags) if flags else ''}, {mtp}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def command(spec: ServerSpec, port: int) -> list[str]:
    """The server's command line. Per-sequence context is the same for both: ours loads ``--parallel``
    sequences of ``--ctx`` tokens each; llama-server splits ``-c`` over its slots (without a unified KV
    buffer), so it gets ``n_ctx * parallel``."""
    if spec.engine == "ours":
        cmd = [sys.executable, "-m", "engine", "serve", "--model", spec.model, "--host", "127.0.0.1",
               "--port", str(port), "--parallel", str(spec.parallel), "--ctx", str(spec.n_ctx),
               "--threads", str(spec.threads), "--queue", "64", *(("--swa-full",) if spec.swa_full else ()),
               *spec.pool_flags]
        if spec.n_max:
            cmd += ["--speculative", "mtp", "--n-max", str(spec.n_max), "--p-min", "0"]
            if spec.adaptive:
                cmd.append("--adaptive")
            if spec.draft_vocab:
                cmd += ["--draft-vocab", str(spec.draft_vocab)]
        else:
            cmd += ["--speculative", "off"]
        return cmd
    if spec.engine == "llama-server":
        cmd = [spec.binary, "-m", spec.model, "--host", "127.0.0.1", "--port", str(port),
               "-np", str(spec.parallel), "-c", str(spec.n_ctx * spec.parallel),
               *(spec.pool_flags or ("--no-kv-unified",)),
               "-t", str(spec.threads), "-tb", str(spec.threads), *(("--swa-full",) if spec.swa_full else ())]
        if spec.n_max:  # llama.cpp's own MTP: the head of the same GGUF, p_min 0 as ours
            cmd += ["--spec-type", "draft-mtp", "--spec-draft-n-max", str(spec.n_max), "--spec-draft-p-min", "0"]
        return [*cmd, *spec.extra]
    raise ValueError(f"unknown server {spec.engine!r}")


class RunningServer:
    """A started server: ``port``, its log (a temporary file), ``stop()``. Ready once ``/health`` says 200."""

    def __init__(self, spec: ServerSpec) -> None:
        self.spec = spec
        self.port = free_port()
        self.log = tempfile.NamedTemporaryFile(prefix=f"mtp-bench-{spec.engine}-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(command(spec, self.port), stdin=subprocess.DEVNULL, stdout=self.log,
                                     stderr=subprocess.STDOUT)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.spec.label} exited ({self.proc.returncode}) while loading:\n"
                                   f"{self.log_tail()}")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                conn.request("GET", "/health")
                status = conn.getresponse().status
                conn.close()
                if status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.25)
        raise RuntimeError(f"{self.spec.label} was not ready within {READY_TIMEOUT_S:.0f} s:\n{self.log_tail()}")

    def cpu_seconds(self) -> float:
        """CPU time (user + system) of the server and its children so far (ours: the server and its
        worker). Other load on the machine barely moves it, unlike wall time."""
        import psutil

        total = 0.0
        root = psutil.Process(self.proc.pid)
        for p in (root, *root.children(recursive=True)):
            try:
                t = p.cpu_times()
            except psutil.NoSuchProcess:
                continue
            total += t.user + t.system
        return total

    def log_tail(self, chars: int = 3000) -> str:
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")[-chars:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()
        Path(self.log.name).unlink(missing_ok=True)

    def __enter__(self) -> RunningServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class Completion:
    """One streamed completion as the client saw it, with what the server said about drafting."""

    seconds: float
    ttft: float
    text: str
    tokens: int
    prompt_tokens: int
    cached: int  # prompt tokens the server reused (timings.cache_n)
    drafted: int
    accepted: int
    prompt_ms: float = 0.0  # the server's own time for the prompt (timings.prompt_ms): TTFT less the rest

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def draft_counts(final: dict[str, Any]) -> tuple[int, int]:
    """(drafted, accepted) from a response's last chunk: ours' ``speculative`` extension where it is
    there, else ``timings.draft_n`` / ``draft_n_accepted`` (llama-server's, which ours also sends)."""
    spec = final.get("speculative") or {}
    if "drafted" in spec:
        return int(spec["drafted"]), int(spec["accepted"])
    timings = final.get("timings") or {}
    return int(timings.get("draft_n") or 0), int(timings.get("draft_n_accepted") or 0)


def complete(port: int, prompt: str, max_tokens: int, timeout: float = 900.0) -> Completion:
    """One greedy streaming ``/v1/completions`` request; time to first token is the first chunk with text."""
    body = json.dumps({"model": "bench", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                       "stream": True, "stream_options": {"include_usage": True}, "cache_prompt": True})
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:300]!r}")
    ttft: float | None = None
    text, usage, final = "", {}, {}
    for raw in resp:
        line = raw.decode("utf-8").strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        data = json.loads(line[6:])
        for choice in data.get("choices") or []:
            if choice.get("text"):
                ttft = ttft if ttft is not None else time.perf_counter() - t0
                text += choice["text"]
        if data.get("usage"):
            usage = data["usage"]
        if data.get("timings") or data.get("speculative"):
            final = data
    conn.close()
    seconds = time.perf_counter() - t0
    timings = final.get("timings") or {}
    drafted, accepted = draft_counts(final)
    return Completion(seconds=seconds, ttft=ttft if ttft is not None else seconds, text=text,
                      tokens=int(usage.get("completion_tokens") or timings.get("predicted_n") or 0),
                      prompt_tokens=int(usage.get("prompt_tokens") or 0), cached=int(timings.get("cache_n") or 0),
                      drafted=drafted, accepted=accepted, prompt_ms=float(timings.get("prompt_ms") or 0.0))


def add_llama_server_args(p: argparse.ArgumentParser) -> None:
    """The options both comparison benchmarks take for llama-server."""
    p.add_argument("--llama-server-arg", action="append", default=[], metavar="ARG",
                   help="pass ARG to llama-server too (repeatable; e.g. --llama-server-arg=--ctx-checkpoints=4)")


def llama_server_binary(explicit: str | None = None) -> Path | None:
    """The llama-server built for this engine (``build_reference_driver.py --server``), or ``explicit``."""
    if explicit:
        return Path(explicit)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "packaging"))
    try:
        import build_reference_driver as brd  # type: ignore[import-not-found]
    except ImportError:
        return None
    path: Path = brd.server_path("cpu")
    return path if path.exists() else None
