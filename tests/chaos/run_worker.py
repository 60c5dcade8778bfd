"""Chaos category ``worker``: SIGKILL the worker mid-reply (from `mtp-studio chat` and from the
protocol client), kill the CLI under a live worker, and runaway chat templates."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from tests.chaos import common as C
from tests.chaos import gguf_file as G

PROMPT = "once upon a time"
LONG = 1500  # tokens in the reply that gets killed (about 1–3 s on the tiny models)
SHORT = 48  # tokens in the reply that proves a new worker answers


def chat_cmd(model: Path, tokens: int, mtp: bool) -> list[str]:
    cmd = [*C.CLI, "chat", PROMPT, "--model", str(model), "--raw", "--threads", "1", "--ctx", "2048",
           "--max-tokens", str(tokens)]
    return [*cmd, "--mtp", "--n-max", "3"] if mtp else cmd


class Streamed:
    """A CLI run whose stdout is read as it arrives."""

    def __init__(self, cmd: list[str]) -> None:
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                     cwd=C.ROOT, start_new_session=True)
        self.out = bytearray()
        self.err = b""
        self._t = threading.Thread(target=self._read, daemon=True)
        self._t.start()
        self._e = threading.Thread(target=self._read_err, daemon=True)
        self._e.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        while chunk := os.read(self.proc.stdout.fileno(), 4096):
            self.out += chunk

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        self.err = self.proc.stderr.read()

    def wait(self, timeout: float) -> bool:
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            C.kill_group(self.proc)
            self.proc.wait()
            return False
        self._t.join(5)
        self._e.join(5)
        return True

    def worker_pid(self, timeout: float = 30) -> int | None:
        end = time.monotonic() + timeout
        while time.monotonic() < end and self.proc.poll() is None:
            kids = C.children(self.proc.pid)
            if kids:
                return kids[0]
            time.sleep(0.005)
        return None


def run(ctx: Any, bases: dict[str, dict[str, Path]]) -> None:
    n = 4 if ctx.quick else 20
    refs: dict[tuple[str, bool, int], str] = {}

    def reference(arch: str, mtp: bool, tokens: int) -> str:
        key = (arch, mtp, tokens)
        if key not in refs:
            res = C.run(chat_cmd(bases[arch]["combined"], tokens, mtp), 120, memory=C.WORKER_MEMORY)
            if res.rc != 0:
                raise SystemExit(f"the reference reply failed: {res.err[-2000:]}")
            refs[key] = res.out
        return refs[key]

    for i in range(n):
        case = f"worker-kill-{i:02d}"
        if ctx.wanted(case):
            rng = ctx.rng("worker", i)
            arch, mtp = rng.choice(["glm4moe", "step35"]), rng.random() < 0.5
            kill_mid_reply(ctx, case, rng, bases[arch]["combined"], mtp, reference(arch, mtp, LONG),
                           reference(arch, mtp, SHORT))
    for i in range(2 if ctx.quick else 6):
        case = f"worker-kill-cli-{i:02d}"
        if ctx.wanted(case):
            kill_cli(ctx, case, ctx.rng("worker-cli", i), bases["glm4moe"]["combined"])
    for i in range(3 if ctx.quick else 12):
        case = f"worker-kill-client-{i:02d}"
        if ctx.wanted(case):
            kill_client(ctx, case, ctx.rng("worker-client", i), bases)
    runaway_templates(ctx, bases)


def kill_mid_reply(ctx: Any, case: str, rng: Any, model: Path, mtp: bool, ref: str, ref_short: str) -> None:
    row = "worker: SIGKILL mid-reply (chat CLI)"
    phase = rng.choice(["reply", "reply", "reply", "start"])
    at = rng.randrange(1, int(len(ref.encode()) * 0.9))
    label = f"{case} {model.parent.name.split('-')[0]}{' --mtp' if mtp else ''}: kill the worker " + (
        f"after {at} bytes of the reply" if phase == "reply" else "as soon as it starts")
    run_ = Streamed(chat_cmd(model, LONG, mtp))
    pid = run_.worker_pid()
    outcomes: list[tuple[str, str]] = []
    if pid is not None:
        if phase == "reply":
            end = time.monotonic() + 60
            while len(run_.out) < at and run_.proc.poll() is None and time.monotonic() < end:
                time.sleep(0.001)
        else:
            time.sleep(rng.random() * 0.2)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    finished = run_.wait(60)
    out, err = run_.out.decode("utf-8", "replace"), run_.err.decode("utf-8", "replace")
    note = None
    if not finished:
        outcomes.append((C.HANG, f"{label}: the CLI did not end within 60 s of the kill"))
    elif run_.proc.returncode < 0:
        outcomes.append((C.CRASH, f"{label}: the CLI died of signal {-run_.proc.returncode}"))
    elif C.has_traceback(err):
        outcomes.append((C.TRACEBACK, f"{label}: {C.last_line(err)}"))
    elif run_.proc.returncode == 0:
        note = "the reply finished before the kill landed"
        outcomes.append((C.OK, label))
    elif "SIGKILL" in err or "engine process" in err:
        outcomes.append((C.CLEAN, f"{label}: {C.last_line(err)}"))
    else:
        outcomes.append((C.OTHER, f"{label}: exit {run_.proc.returncode} without saying the engine died: "
                                  f"{C.last_line(err)}"))
    if not ref.startswith(out.rstrip("\n")):
        outcomes.append((C.LOST, f"{label}: the streamed text is not a prefix of the reply "
                                 f"({len(out)} bytes streamed)"))
    if pid is not None and C.alive(pid):
        outcomes.append((C.HANG, f"{label}: worker {pid} still alive after the kill"))
    again = C.run(chat_cmd(model, SHORT, mtp), 120, memory=C.WORKER_MEMORY)
    if again.timed_out or again.rc != 0 or again.out != ref_short:
        outcomes.append((C.LOST, f"{label}: the next worker did not give the same reply (exit {again.rc}, "
                                 f"{C.last_line(again.err)})"))
    ctx.tally.record(row, case, outcomes, note)
    print(f"  {label}: {[o for o, _ in outcomes]}", file=sys.stderr, flush=True)


def kill_cli(ctx: Any, case: str, rng: Any, model: Path) -> None:
    """SIGKILL the CLI (not the worker) mid-reply: the orphaned worker must notice and exit."""
    row = "worker: SIGKILL the CLI mid-reply"
    at = rng.randrange(1, 4000)
    label = f"{case}: kill `mtp-studio chat` after {at} bytes of the reply"
    run_ = Streamed(chat_cmd(model, LONG, False))
    pid = run_.worker_pid()
    end = time.monotonic() + 60
    while len(run_.out) < at and run_.proc.poll() is None and time.monotonic() < end:
        time.sleep(0.001)
    run_.proc.kill()
    run_.wait(10)
    outcomes: list[tuple[str, str]] = [(C.OK, label)]
    if pid is not None:
        end = time.monotonic() + 15
        while C.alive(pid) and time.monotonic() < end:
            time.sleep(0.05)
        if C.alive(pid):
            outcomes.append((C.HANG, f"{label}: the orphaned worker {pid} is still running 15 s later"))
            os.kill(pid, signal.SIGKILL)
    ctx.tally.record(row, case, outcomes)
    print(f"  {label}: {[o for o, _ in outcomes]}", file=sys.stderr, flush=True)


def kill_client(ctx: Any, case: str, rng: Any, bases: dict[str, dict[str, Path]]) -> None:
    """The protocol client: kill at a random event of a load or a reply; it must raise WorkerDied, and a
    new worker must give the whole reply."""
    from engine.speculative.settings import SPECULATION_OFF, SpeculativeSettings
    from engine.worker import client as client_mod
    from engine.worker import protocol as P

    row = "worker: SIGKILL mid-reply (protocol client)"
    client_mod.worker_command = C.worker_command
    arch = rng.choice(["glm4moe", "step35"])
    model = str(bases[arch]["combined"])
    spec = SpeculativeSettings("mtp", rng.choice([1, 2, 3]), 0, 0.0) if rng.random() < 0.5 else SPECULATION_OFF
    phase = rng.choice(["load", "reply", "reply", "reply", "cancel"])
    kill_at = rng.randrange(1, 400)
    label = f"{case} {arch} {spec.mode}: kill during the " + (
        "load" if phase == "load" else f"reply at event {kill_at}" + (" after a cancel" if phase == "cancel" else ""))
    outcomes: list[tuple[str, str]] = []

    def whole_reply(c: Any) -> str:
        c.call(P.LoadRequest(id=c.new_id(), options=P.LoadOptions(path=model, n_ctx=1024, n_threads=1)), timeout=60)
        ev = c.call(P.GenerateRequestMsg(id=c.new_id(), prompt=PROMPT, max_tokens=200, speculative=spec),
                    timeout=60)
        return "".join(e.text for e in ev if isinstance(e, P.TokenEvent))

    with client_mod.WorkerClient() as good:
        expected = whole_reply(good)
    client = client_mod.WorkerClient()
    got = ""
    try:
        if phase == "load":
            client.send(P.LoadRequest(id=client.new_id(), options=P.LoadOptions(path=model, n_ctx=1024, n_threads=1)))
            time.sleep(rng.random() * 0.05)
            client.proc.kill()
            list(client.events_until_done("none", timeout=20))
        else:
            options = P.LoadOptions(path=model, n_ctx=1024, n_threads=1)
            client.call(P.LoadRequest(id=client.new_id(), options=options), timeout=60)
            req = P.GenerateRequestMsg(id=client.new_id(), prompt=PROMPT, max_tokens=2000, speculative=spec)
            client.send(req)
            for k, ev in enumerate(client.events_until_done(req.id, timeout=20)):
                if isinstance(ev, P.TokenEvent):
                    got += ev.text
                if k == kill_at:
                    if phase == "cancel":
                        client.send(P.CancelRequest(id=client.new_id(), target=req.id))
                    client.proc.kill()
        outcomes.append((C.OTHER if phase == "load" else C.OK, f"{label}: no WorkerDied reported"))
    except client_mod.WorkerDied as exc:
        outcomes.append((C.CLEAN, f"{label}: {exc}"))
    except TimeoutError:
        outcomes.append((C.HANG, f"{label}: the client waited 20 s without noticing the death"))
    finally:
        client.proc.kill()
        client.proc.wait()
    stream_ok = expected.startswith(got) or got.startswith(expected)
    if not stream_ok:
        outcomes.append((C.LOST, f"{label}: the tokens before the kill are not a prefix of the reply"))
    try:
        with client_mod.WorkerClient() as fresh:
            if whole_reply(fresh) != expected:
                outcomes.append((C.LOST, f"{label}: a new worker gave a different reply"))
    except Exception as exc:  # noqa: BLE001
        outcomes.append((C.LOST, f"{label}: a new worker did not answer: {type(exc).__name__}: {exc}"))
    ctx.tally.record(row, case, outcomes)
    print(f"  {label}: {[o for o, _ in outcomes]}", file=sys.stderr, flush=True)


TEMPLATES = {
    "loop": "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}x",
    "memory": "{% set ns = namespace(s='x') %}{% for a in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}"
              "{{ ns.s }}",
    "power": "{{ 'x' * 10**10 }}",
    "recursion": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
}


def runaway_templates(ctx: Any, bases: dict[str, dict[str, Path]]) -> None:
    """Hostile chat templates: the worker must give up on its own, stop on cancel, and exit on EOF."""
    from engine.worker import client as client_mod
    from engine.worker import protocol as P

    row = "worker: runaway chat template"
    client_mod.worker_command = C.worker_command
    plans = [("loop", "wait"), ("loop", "cancel"), ("loop", "eof"), ("memory", "wait"), ("power", "wait"),
             ("recursion", "wait")]
    if ctx.quick:
        plans = plans[:3]
    base = bases["glm4moe"]["combined"].read_bytes()
    for i, (name, how) in enumerate(plans):
        case = f"worker-template-{i:02d}"
        if not ctx.wanted(case):
            continue
        label = f"{case}: a {name} template, then {how}"
        g = G.parse(base)
        idx = g.key_index("tokenizer.chat_template")
        entry = (b"tokenizer.chat_template", G.Value(G.STRING, TEMPLATES[name].encode()))
        if idx is None:
            g.kvs.append(entry)
        else:
            g.kvs[idx] = entry
        path = ctx.tmp / f"{case}.gguf"
        path.write_bytes(G.serialize(g))
        outcomes: list[tuple[str, str]] = []
        client = client_mod.WorkerClient(stderr=subprocess.DEVNULL)
        pid = client.proc.pid
        try:
            options = P.LoadOptions(path=str(path), n_ctx=512, n_threads=1)
            client.call(P.LoadRequest(id=client.new_id(), options=options), timeout=60)
            req = P.GenerateRequestMsg(id=client.new_id(), messages=[{"role": "user", "content": "hi"}],
                                       max_tokens=4)
            client.send(req)
            if how == "wait":
                events = list(client.events_until_done(req.id, timeout=60))
                errors = [e for e in events if isinstance(e, P.ErrorEvent)]
                if any(e.kind == "internal" for e in errors):
                    outcomes.append((C.TRACEBACK, f"{label}: internal error {errors[0].message}"))
                else:
                    outcomes.append((C.CLEAN if errors else C.OK,
                                     f"{label}: " + (f"[{errors[0].kind}] {errors[0].message}" if errors else "")))
            elif how == "cancel":
                time.sleep(1.0)
                client.send(P.CancelRequest(id=client.new_id(), target=req.id))
                t0 = time.monotonic()
                events = list(client.events_until_done(req.id, timeout=10))
                outcomes.append((C.CLEAN, f"{label}: {events[-1].type} "
                                          f"{time.monotonic() - t0:.1f} s after the cancel"))
            else:
                time.sleep(1.0)
                assert client.proc.stdin is not None
                client.proc.stdin.close()
                try:
                    client.proc.wait(timeout=15)
                    outcomes.append((C.OK, f"{label}: exited {client.proc.returncode}"))
                except subprocess.TimeoutExpired:
                    outcomes.append((C.HANG, f"{label}: the worker still runs 15 s after its stdin closed"))
        except TimeoutError as exc:
            outcomes.append((C.HANG, f"{label}: {exc}"))
        except client_mod.WorkerDied as exc:
            outcomes.append((C.CLEAN, f"{label}: worker died, reported: {exc}"))
        finally:
            if client.proc.poll() is None:
                client.proc.kill()
            client.proc.wait()
            path.unlink(missing_ok=True)
        if C.alive(pid):
            outcomes.append((C.HANG, f"{label}: worker {pid} outlived its client"))
        ctx.tally.record(row, case, outcomes)
        print(f"  {label}", file=sys.stderr, flush=True)
