"""The third campaign's findings (issue 31), kept found: hostile requests to the server, RPC servers that
trickle or lie, and hub names that are not names.

- *server*: a real worker behind the real HTTP server on loopback. A lone surrogate in each text field
  must be a 400, and a good request right after it must be served (the campaign's "locked for good");
  Host look-alikes must be refused; a silent connection and a header sent a byte a second must be cut
  off by the server's own deadline.
- *rpc*: fake ggml RPC servers on loopback (a HELLO trickled a byte at a time, 2^32-1 devices, silence);
  ``mtp-studio rpc-probe`` must end within its deadline with a message.
- *hub names*: a NUL in a file name, repo ids ``..`` and ``acme/..``: refused with a message, no folder.
"""

from __future__ import annotations

import http.client
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from tests.chaos import common as C
from tests.fake_rpc import HELLO, read_command, reply

SURROGATE = "\\ud800"  # as JSON text: the body is valid JSON, the string is not valid Unicode
BODIES = {
    "prompt": '{"model": "m", "prompt": "a' + SURROGATE + '", "max_tokens": 4}',
    "content": '{"model": "m", "messages": [{"role": "user", "content": "' + SURROGATE + '"}], "max_tokens": 4}',
    "stop": '{"model": "m", "prompt": "a", "stop": ["' + SURROGATE + '"], "max_tokens": 4}',
    "model": '{"model": "' + SURROGATE + '", "prompt": "a", "max_tokens": 4}',
    "parameter-name": '{"model": "m", "prompt": "a", "max_tokens": 4, "x' + SURROGATE + '": 1}',
}
HEAD_DEADLINE_S = 10  # engine/server/deadlines.py; a cut-off must come within this and a slack
SLACK_S = 6


def run(ctx, bases: dict[str, dict[str, Path]]) -> None:
    _server_cases(ctx, bases)
    _rpc_cases(ctx)
    _hub_name_cases(ctx)


# -- server --------------------------------------------------------------------------------------------------

def _request(port: int, body: str, host: str | None = None, path: str = "/v1/completions") -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {"Content-Type": "application/json"}
    if host is not None:
        headers["Host"] = host
    try:
        conn.request("POST", path, body=body.encode(), headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read().decode("utf-8", "replace")
    finally:
        conn.close()


def _server_cases(ctx, bases: dict[str, dict[str, Path]]) -> None:
    from engine.server.config import ServerConfig
    from engine.server.engine_link import WorkerLink, load_request_for
    from engine.server.runner import ServerThread
    from engine.speculative.settings import mtp

    link = WorkerLink(load_request_for(str(bases["glm4moe"]["combined"]), n_ctx=2048, n_threads=1),
                      speculative=mtp(3))
    server = ServerThread(link, ServerConfig(port=0, model_id="m")).start()
    good = '{"model": "m", "prompt": "the river", "max_tokens": 4}'
    try:
        for field, body in BODIES.items():
            case = f"campaign-surrogate-{field}"
            if not ctx.wanted(case):
                continue
            outcomes = []
            try:
                status, text = _request(server.port, body)
                outcomes.append((C.CLEAN, f"{status}") if status == 400 else
                                (C.TRACEBACK if status >= 500 else C.OTHER, f"{status}: {text[:120]}"))
                status, text = _request(server.port, good)
                if status != 200:
                    outcomes.append((C.OTHER, f"the good request after it: {status} {text[:120]} (server locked)"))
            except (TimeoutError, OSError) as exc:
                outcomes.append((C.HANG, f"no answer: {exc}"))
            ctx.tally.record("campaign: server, lone surrogate then a good request", case, outcomes)
        for i, host in enumerate(("[::1]evil.example", f"127.0.0.1:{server.port}@evil.example")):
            case = f"campaign-host-{i:02d}"
            if ctx.wanted(case):
                try:
                    status, text = _request(server.port, good, host=host)
                    outcome = (C.CLEAN, str(status)) if 400 <= status < 500 else (C.OTHER, f"{host!r}: {status}")
                except (TimeoutError, OSError) as exc:
                    outcome = (C.HANG, f"no answer: {exc}")
                ctx.tally.record("campaign: server, Host look-alikes", case, [outcome])
        _slow_clients(ctx, server.port)
    finally:
        server.stop()
        link.close()


def _slow_clients(ctx, port: int) -> None:
    """A silent connection and a header a byte a second, side by side: each must be closed by the server."""
    results: dict[str, tuple[str, str]] = {}

    def client(name: str, trickle: bytes) -> None:
        sock = socket.create_connection(("127.0.0.1", port))
        sock.settimeout(1)
        start = time.monotonic()
        sent = 0
        try:
            while time.monotonic() - start < HEAD_DEADLINE_S + SLACK_S:
                if sent < len(trickle):
                    try:
                        sock.sendall(trickle[sent:sent + 1])
                        sent += 1
                    except OSError:
                        results[name] = (C.CLEAN, f"closed after {time.monotonic() - start:.1f} s")
                        return
                try:
                    if sock.recv(4096) == b"":
                        results[name] = (C.CLEAN, f"closed after {time.monotonic() - start:.1f} s")
                        return
                except TimeoutError:
                    continue
                except OSError:
                    results[name] = (C.CLEAN, f"reset after {time.monotonic() - start:.1f} s")
                    return
            results[name] = (C.HANG, f"still open after {HEAD_DEADLINE_S + SLACK_S} s")
        finally:
            sock.close()

    slow_head = b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: " + b"a" * 100
    wanted = {name: trickle for name, trickle in (("campaign-silent-connection", b""),
                                                  ("campaign-slow-header", slow_head)) if ctx.wanted(name)}
    threads = [threading.Thread(target=client, args=item) for item in wanted.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for name in wanted:
        ctx.tally.record("campaign: server, silent and slow clients", name, [results.get(name, (C.OTHER, "no result"))])


# -- rpc -----------------------------------------------------------------------------------------------------

def _trickle(conn: socket.socket) -> None:
    read_command(conn)
    for byte in reply(HELLO):
        conn.sendall(bytes([byte]))
        time.sleep(0.3)


def _absurd(conn: socket.socket) -> None:
    read_command(conn)
    conn.sendall(reply(HELLO))
    read_command(conn)
    conn.sendall(reply(struct.pack("<I", 2**32 - 1)))
    while True:
        read_command(conn)
        time.sleep(0.05)
        conn.sendall(reply(struct.pack("<QQ", 1 << 30, 1 << 31)))


def _silent(conn: socket.socket) -> None:
    time.sleep(30)


def _fake_rpc(script: Callable[[socket.socket], None]) -> tuple[socket.socket, int]:
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                try:
                    script(conn)
                except OSError:
                    pass

    threading.Thread(target=serve, daemon=True).start()
    return listener, listener.getsockname()[1]


def _rpc_cases(ctx) -> None:
    timeout_s = 2.0
    for name, script in (("trickled-hello", _trickle), ("four-billion-devices", _absurd), ("silent", _silent)):
        case = f"campaign-rpc-{name}"
        if not ctx.wanted(case):
            continue
        listener, port = _fake_rpc(script)
        try:
            res = C.run([sys.executable, "-m", "engine", "rpc-probe", f"127.0.0.1:{port}", "--timeout",
                         str(timeout_s)], timeout=20)
        finally:
            listener.close()
        outcome = C.classify_cli(res, "rpc-probe")
        if outcome[0] == C.OK:
            outcome = (C.OTHER, "rpc-probe said ok")
        elif outcome[0] == C.CLEAN and res.seconds > timeout_s + 5:
            outcome = (C.HANG, f"rpc-probe took {res.seconds:.1f} s for a {timeout_s:g} s deadline")
        ctx.tally.record("campaign: rpc-probe, hostile servers", case, [outcome])


# -- hub names -----------------------------------------------------------------------------------------------

def _hub_name_cases(ctx) -> None:
    from engine.store import download as dl
    from tests.fake_hub import FakeHub

    source = ctx.tmp / "campaign-hub" / "a.gguf"
    source.parent.mkdir(parents=True, exist_ok=True)
    source.write_bytes(b"GGUF" + bytes(1000))
    row = "campaign: hub names"
    with FakeHub({"acme/m": {"a.gguf": source}}) as hub:
        case = "campaign-hub-nul"
        if ctx.wanted(case):  # argv cannot hold a NUL: the models page passes names straight in
            dest = ctx.tmp / "campaign-nul"
            try:
                dl.download("acme/m", "a\x00.gguf", dest, endpoint=hub.url)
                outcome = (C.OTHER, "downloaded")
            except dl.DownloadError as exc:
                outcome = (C.CLEAN, str(exc)) if not dest.exists() else (C.OTHER, f"made {dest}")
            except Exception as exc:  # noqa: BLE001 - what the campaign found: anything else is a traceback
                outcome = (C.TRACEBACK, f"{type(exc).__name__}: {exc}")
            ctx.tally.record(row, case, [outcome])
        for i, repo in enumerate(("..", "acme/..")):
            case = f"campaign-hub-repo-{i:02d}"
            if not ctx.wanted(case):
                continue
            dest = ctx.tmp / f"campaign-repo-{i}"
            res = C.run([sys.executable, "-m", "engine", "models", "download", repo, "a.gguf", "--dest", str(dest)],
                        timeout=30, env={"HF_ENDPOINT": hub.url})
            outcome = C.classify_cli(res, f"models download {repo}")
            if outcome[0] == C.CLEAN and dest.exists():
                outcome = (C.OTHER, f"refused, but made {dest}")
            ctx.tally.record(row, case, [outcome])
