"""Chaos category ``protocol``: malformed and hostile lines on the worker's stdin.

After each input the script sends a plain ``unload`` request (the cheapest
request with a final event of its own) and waits for its ``unloaded``: the
worker must still answer. A malformed line must get an ``error`` event; EOF
must make the worker exit; nothing may reach the worker's stderr as a
traceback or come back as an ``internal`` error.
"""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.chaos import common as C

ANSWER_TIMEOUT = 20.0


class Died(Exception):
    pass


class RawWorker:
    """The worker over raw byte pipes, so that any bytes at all can be sent."""

    def __init__(self, log: Path) -> None:
        from engine.worker import protocol as P

        self.P = P
        self.log = log
        self._log = log.open("ab")
        self.log_pos = log.stat().st_size
        self.proc = subprocess.Popen(C.worker_command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._log, cwd=C.ROOT)
        self.events: queue.Queue[Any] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        hello = self.next(60)
        if not isinstance(hello, P.ReadyEvent):
            raise RuntimeError(f"no handshake: {hello}")

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                self.events.put(self.P.decode_event(line.decode("utf-8")))
            except Exception as exc:  # noqa: BLE001
                self.events.put(("undecodable", f"{type(exc).__name__}: {line[:200]!r}"))
        self.events.put(None)

    def send(self, data: bytes, timeout: float = ANSWER_TIMEOUT) -> None:
        """Write in a thread: a worker that stopped reading must not block the script."""
        errors: list[BaseException] = []

        def write() -> None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(data)
                self.proc.stdin.flush()
            except (BrokenPipeError, OSError, ValueError) as exc:
                errors.append(exc)

        t = threading.Thread(target=write, daemon=True)
        t.start()
        t.join(timeout)
        if t.is_alive():
            raise TimeoutError(f"the worker did not read {len(data)} bytes within {timeout:.0f} s")
        if errors:
            raise Died(f"stdin closed ({errors[0]}); {C.describe_exit(self.proc.poll())}")

    def next(self, timeout: float) -> Any:
        try:
            item = self.events.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"no event within {timeout:.0f} s") from None
        if item is None:
            self.events.put(None)
            try:
                code = self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                code = None
            raise Died(C.describe_exit(code))
        return item

    def until(self, request_id: str, timeout: float = ANSWER_TIMEOUT) -> list[Any]:
        """Events up to the final event of ``request_id``."""
        out = []
        end = time.monotonic() + timeout
        while True:
            ev = self.next(max(0.01, end - time.monotonic()))
            out.append(ev)
            if not isinstance(ev, tuple) and ev.id == request_id and self.P.is_final(ev):
                return out

    def request(self, obj: dict[str, Any], timeout: float = ANSWER_TIMEOUT) -> list[Any]:
        self.send(json.dumps(obj).encode() + b"\n")
        return self.until(obj["id"], timeout)

    def new_stderr(self) -> str:
        self._log.flush()
        with self.log.open("rb") as f:
            f.seek(self.log_pos)
            data = f.read()
        self.log_pos += len(data)
        return data.decode("utf-8", "replace")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._log.close()


@dataclass
class Case:
    label: str
    payload: bytes
    # error: an error event; answer: a normal answer; final: its own final event, error or not;
    # any: anything but a bad outcome; keeps-model: refused, the model loaded before still there;
    # no-tokens: no token events; eof: the worker exits; flood: every request answered; blank: ignored
    expect: str = "error"
    needs_model: bool = False
    request_id: str | None = None  # the id of the payload's own request, when it has one
    timeout: float = ANSWER_TIMEOUT


def j(obj: Any) -> bytes:
    return json.dumps(obj).encode()


def cases(model: str) -> list[Case]:
    gen = {"type": "generate", "prompt": "hi", "max_tokens": 2}
    good = {"path": model, "n_ctx": 512, "n_threads": 1}

    def load(rid: str, **options: Any) -> dict[str, Any]:  # the good load, but these options
        return {"type": "load", "id": rid, "options": {**good, **options}}

    out = [
        Case("an unterminated object", b"{"),
        Case("plain text", b"not json at all"),
        Case("a JSON array cut short", b"[1, 2"),
        Case("single quotes", b"{'type': 'unload', 'id': 'q'}"),
        Case("a trailing comma", b'{"type": "unload", "id": "tc",}'),
        Case("control bytes", b"\x00\x01\x02\x1b[2J"),
        Case("an object and trailing text", b'{"type": "unload", "id": "tt"} and more'),
        Case("a bare NaN", b"NaN"),
        Case("a number", b"1"),
        Case("null", b"null"),
        Case("an empty array", b"[]"),
        Case("a string", b'"unload"'),
        Case("true", b"true"),
        Case("a request inside an array", b'[{"type": "unload", "id": "arr"}]'),
        Case("arrays nested 100,000 deep", b"[" * 100_000 + b"]" * 100_000),
        Case("objects nested 50,000 deep", b'{"a":' * 50_000 + b"1" + b"}" * 50_000),
        Case("a million unclosed brackets", b"[" * 1_000_000),
        Case("a load whose path is nested 50,000 deep",
             b'{"type": "load", "id": "deep", "options": {"path": ' + b"[" * 50_000 + b"]" * 50_000 + b"}}"),
        Case("a generate whose messages nest 20,000 deep",
             b'{"type": "generate", "id": "deepm", "messages": ' + b"[" * 20_000 + b"]" * 20_000 + b"}",
             needs_model=True),
        Case("a 50 MB line of garbage", b"x" * 50_000_000, timeout=60),
        Case("an unload with a 10 MB id", j({"type": "unload", "id": "x" * 10_000_000}), expect="answer",
             timeout=60),
        Case("a load with a 10 MB path", j(load("lp", path="a" * 10_000_000)), timeout=60),
        Case("a 10 MB prompt on a 512-token context", j({**gen, "id": "bigp", "prompt": "word " * 2_000_000}),
             expect="final", needs_model=True, request_id="bigp", timeout=90),
        Case("id is a number", j({"type": "unload", "id": 1})),
        Case("id is null", j({"type": "unload", "id": None})),
        Case("id is an object", j({"type": "unload", "id": {}})),
        Case("no id", j({"type": "unload"})),
        Case("type is a number", j({"type": 1, "id": "t1"})),
        Case("type is null", j({"type": None, "id": "tn"})),
        Case("no type", j({"id": "nt"})),
        Case("type ping (there is none)", j({"type": "ping", "id": "ping"})),
        Case("type __init__", j({"type": "__init__", "id": "init"})),
        Case("type LOAD (case)", j({"type": "LOAD", "id": "up"})),
        Case("an unknown field", j({"type": "unload", "id": "uf", "force": True})),
        Case("n_ctx as a string", j(load("c1", n_ctx="4096"))),
        Case("n_ctx 4096.5", j(load("c2", n_ctx=4096.5))),
        Case("n_ctx true", j(load("c3", n_ctx=True))),
        Case("n_ctx null", j(load("c4", n_ctx=None))),
        Case("mtp as a string", j(load("c5", mtp="yes"))),
        Case("path as a number", j(load("c6", path=5))),
        Case("n_ctx -1 after a model is loaded", j(load("c7", n_ctx=-1)), expect="keeps-model",
             needs_model=True, request_id="c7"),
        Case("n_ctx 2^31 after a model is loaded", j(load("c8", n_ctx=2**31)), expect="keeps-model",
             needs_model=True, request_id="c8", timeout=60),
        Case("n_ctx 0 after a model is loaded", j(load("c8b", n_ctx=0)), expect="keeps-model",
             needs_model=True, request_id="c8b", timeout=60),
        Case("n_threads 100000 after a model is loaded", j(load("c9", n_threads=100_000)),
             expect="keeps-model", needs_model=True, request_id="c9", timeout=60),
        Case("n_threads -1 after a model is loaded", j(load("c10", n_threads=-1)),
             expect="keeps-model", needs_model=True, request_id="c10", timeout=60),
        Case("n_gpu_layers -5", j(load("c11", n_gpu_layers=-5)), expect="final", request_id="c11",
             timeout=60),
        Case("path is a folder", j(load("c12", path="/")), expect="keeps-model", needs_model=True,
             request_id="c12"),
        Case("path is /dev/zero", j(load("c13", path="/dev/zero")), expect="keeps-model",
             needs_model=True, request_id="c13"),
        Case("path is empty", j(load("c14", path="")), expect="keeps-model", needs_model=True,
             request_id="c14"),
        Case("a sidecar that does not exist", j(load("c15", sidecar="/nonexistent.gguf")),
             expect="keeps-model", needs_model=True, request_id="c15"),
        Case("prompt is a number", j({**gen, "id": "g1", "prompt": 5}), needs_model=True),
        Case("messages is a string", j({"type": "generate", "id": "g2", "messages": "hi"}), needs_model=True),
        Case("a message with a numeric role", j({"type": "generate", "id": "g3",
                                                  "messages": [{"role": 1, "content": "x"}]}), needs_model=True),
        Case("a message without content", j({"type": "generate", "id": "g4", "messages": [{"role": "user"}]}),
             expect="final", needs_model=True, request_id="g4"),
        Case("messages of numbers", j({"type": "generate", "id": "g5", "messages": [1, 2]}), needs_model=True),
        Case("both prompt and messages", j({**gen, "id": "g6", "messages": [{"role": "user", "content": "x"}]}),
             needs_model=True),
        Case("neither prompt nor messages", j({"type": "generate", "id": "g7"}), needs_model=True),
        Case("stop is a string", j({**gen, "id": "g8", "stop": "x"}), needs_model=True),
        Case("an empty stop string", j({**gen, "id": "g9", "stop": [""], "max_tokens": 8}), expect="final",
             needs_model=True, request_id="g9"),
        Case("speculative is a string", j({**gen, "id": "g10", "speculative": "mtp"}), needs_model=True),
        Case("speculative mode warp", j({**gen, "id": "g11", "speculative": {"mode": "warp"}}), needs_model=True),
        Case("n_max 99", j({**gen, "id": "g12", "speculative": {"mode": "mtp", "n_max": 99}}), needs_model=True),
        Case("temperature as a string", j({**gen, "id": "g13", "sampling": {"temperature": "hot"}}), needs_model=True),
        Case("temperature NaN", b'{"type": "generate", "id": "g14", "prompt": "hi", "sampling": {"temperature": NaN}}',
             expect="final", needs_model=True, request_id="g14"),
        Case("temperature Infinity",
             b'{"type": "generate", "id": "g15", "prompt": "hi", "sampling": {"temperature": Infinity}}',
             expect="final", needs_model=True, request_id="g15"),
        Case("seed -1", j({**gen, "id": "g16", "sampling": {"seed": -1}}), expect="final", needs_model=True,
             request_id="g16"),
        Case("seed 2^70", j({**gen, "id": "g17", "sampling": {"seed": 2**70}}), expect="final", needs_model=True,
             request_id="g17"),
        Case("top_k -5", j({**gen, "id": "g18", "sampling": {"top_k": -5}}), expect="final", needs_model=True,
             request_id="g18"),
        Case("max_tokens -1", j({**gen, "id": "g19", "max_tokens": -1}), expect="no-tokens", needs_model=True,
             request_id="g19"),
        Case("max_tokens 0", j({**gen, "id": "g20", "max_tokens": 0}), expect="no-tokens", needs_model=True,
             request_id="g20"),
        Case("max_tokens 10^30", j({**gen, "id": "g21", "max_tokens": 10**30}), expect="final", needs_model=True,
             request_id="g21", timeout=60),
        Case("a generate with no model loaded", j({**gen, "id": "g22"}), expect="final", request_id="g22"),
        Case("a prompt with a lone surrogate escape", b'{"type": "generate", "id": "g23", "prompt": "a\\ud800b"}',
             expect="final", needs_model=True, request_id="g23"),
        Case("10,000 stop strings", j({**gen, "id": "g24", "stop": [f"s{i}" for i in range(10_000)]}),
             expect="final", needs_model=True, request_id="g24"),
        Case("an empty messages list", j({"type": "generate", "id": "g25", "messages": []}), expect="final",
             needs_model=True, request_id="g25"),
        Case("invalid UTF-8 in an id", b'{"type": "unload", "id": "\xff\xfe"}'),
        Case("invalid UTF-8 alone", b"\xc3\x28\xa0\xa1"),
        Case("invalid UTF-8 in a prompt", b'{"type": "generate", "id": "u3", "prompt": "\xe2\x28\xa1"}',
             needs_model=True),
        Case("a UTF-8 byte-order mark before the object", b'\xef\xbb\xbf{"type": "unload", "id": "bom"}',
             expect="any"),
        Case("a carriage return before the newline", b'{"type": "unload", "id": "cr"}\r', expect="answer"),
        Case("blank lines", b"\n\n   \n\t", expect="blank"),
        Case("a cancel with nothing running", j({"type": "cancel", "id": "k1"}), expect="final", request_id="k1"),
        Case("a cancel for an unknown request", j({"type": "cancel", "id": "k2", "target": "nobody"}),
             expect="final", request_id="k2"),
        Case("2,000 unload requests in one write", b"\n".join(j({"type": "unload", "id": f"f{i}"})
                                                               for i in range(2000)), expect="flood", timeout=60),
        Case("EOF in the middle of a request", b'{"type": "load", "id": "eof", "pa', expect="eof"),
        Case("EOF right after a request with no newline", j({"type": "unload", "id": "nonl"}), expect="eof"),
        Case("EOF during a long reply", j({**gen, "id": "eofg", "max_tokens": 5000}), expect="eof",
             needs_model=True),
    ]
    return out


def run(ctx: Any, bases: dict[str, dict[str, Path]]) -> None:
    model = str(bases["glm4moe"]["combined"])
    all_cases = cases(model)
    if ctx.quick:
        all_cases = all_cases[::3] + [c for c in all_cases[1::3] + all_cases[2::3] if c.expect == "eof"]
    log = ctx.tmp / "protocol-worker.log"
    log.touch()
    worker: RawWorker | None = None
    try:
        for i, case in enumerate(cases(model)):
            cid = f"protocol-{i:02d}"
            if case not in all_cases or not ctx.wanted(cid):
                continue
            if worker is None or worker.proc.poll() is not None:
                if worker is not None:
                    worker.kill()
                worker = RawWorker(log)
            outcomes = one_case(worker, case, model, f"{cid} {case.label}")
            err = worker.new_stderr()
            if C.has_traceback(err) and not any(o == C.TRACEBACK for o, _ in outcomes):
                outcomes.append((C.TRACEBACK, f"{cid} {case.label}: worker stderr: {C.last_line(err)}"))
            if any(o in (C.HANG, C.CRASH) for o, _ in outcomes) or case.expect == "eof":
                worker.kill()
                worker = None
            ctx.tally.record("protocol: malformed input", cid, outcomes)
            print(f"  {cid} {case.label}: {outcomes[-1][0]}", file=sys.stderr, flush=True)
    finally:
        if worker is not None:
            worker.kill()


def one_case(w: RawWorker, case: Case, model: str, label: str) -> list[tuple[str, str]]:
    P = w.P
    try:
        if case.needs_model:
            setup = {"type": "load", "id": "setup", "options": {"path": model, "n_ctx": 512, "n_threads": 1}}
            ev = w.request(setup, 60)
            if not isinstance(ev[-1], P.LoadedEvent):
                return [(C.OTHER, f"{label}: the good model did not load: {ev[-1]}")]
        if case.expect == "eof":
            w.send(case.payload + (b"\n" if case.needs_model else b""))
            if case.needs_model:
                time.sleep(0.3)
            assert w.proc.stdin is not None
            w.proc.stdin.close()
            try:
                code = w.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                return [(C.HANG, f"{label}: the worker still runs 15 s after its stdin closed")]
            if code < 0:
                return [(C.CRASH, f"{label}: {C.describe_exit(code)}")]
            return [(C.OK if code == 0 else C.OTHER, f"{label}: exit {code}")]
        w.send(case.payload + b"\n", timeout=case.timeout)
        pre: list[Any] = []
        check: list[Any] = []
        if case.expect == "keeps-model":  # the docs: a bad load leaves the loaded model in place
            pre = w.until(case.request_id or "", case.timeout)
            check = w.request({"type": "generate", "id": "check", "prompt": "hi", "max_tokens": 2}, 60)
        if case.expect == "flood":
            got = 0
            while got < 2000:
                if isinstance(w.next(case.timeout), P.UnloadedEvent):
                    got += 1
        w.send(b'{"type": "unload", "id": "after"}\n')
        events = w.until("after", case.timeout)
        events = pre + check + events
        own = [e for e in events if not isinstance(e, tuple) and e.id == case.request_id]
        if case.request_id is not None and not any(P.is_final(e) for e in own):
            try:
                own += w.until(case.request_id, 2)
            except TimeoutError:
                return [(C.OTHER, f"{label}: no final event for the request (the worker still answers)")]
    except TimeoutError as exc:
        return [(C.HANG, f"{label}: {exc}")]
    except Died as exc:
        return [(C.CRASH, f"{label}: the worker died: {exc}")]
    return judge(P, case, label, events, own, check)


def judge(P: Any, case: Case, label: str, events: list[Any], own: list[Any],
          check: list[Any]) -> list[tuple[str, str]]:
    errors = [e for e in events if isinstance(e, P.ErrorEvent)]
    junk = [e for e in events if isinstance(e, tuple)]
    if junk:
        return [(C.OTHER, f"{label}: an event the client cannot decode: {junk[0][1]}")]
    internal = [e for e in errors if e.kind == "internal"]
    if internal:
        return [(C.TRACEBACK, f"{label}: internal error: {internal[0].message[:200]}")]
    first = f"[{errors[0].kind}] {errors[0].message[:160]}" if errors else ""
    if case.expect == "error":
        return [(C.CLEAN, f"{label}: {first}")] if errors else [(C.OTHER, f"{label}: no error event")]
    if case.expect == "no-tokens":
        if any(isinstance(e, P.TokenEvent) for e in own):
            return [(C.OTHER, f"{label}: tokens were generated")]
        return [(C.CLEAN if errors else C.OK, f"{label}: {first}")]
    if case.expect == "keeps-model":
        if isinstance(own[-1], P.LoadedEvent):
            return [(C.OK, f"{label}: loaded")]
        if any(isinstance(e, P.ErrorEvent) and e.kind == "no_model" for e in check):
            return [(C.OTHER, f"{label}: refused ({first}) but the model loaded before is gone")]
    if case.expect == "answer" and errors:
        return [(C.OTHER, f"{label}: refused: {first}")]
    return [(C.CLEAN if errors else C.OK, f"{label}: {first}")]

