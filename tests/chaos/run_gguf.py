"""Chaos category ``gguf``: mutated model files through info, doctor, models list and a worker load."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

from engine.errors import EngineError  # noqa: F401  (imported early: the client needs it)
from tests.chaos import common as C
from tests.chaos import gguf_file as G

INFO_TIMEOUT = 20.0
RETRIED = "timed out once and answered when run again (a stall of the machine, not of the program)"
LOAD_TIMEOUT = 60.0
REPLY_TIMEOUT = 30.0


class WorkerSlot:
    """One worker reused across cases, replaced when it dies or hangs."""

    def __init__(self, tmp: Path) -> None:
        self.client: Any = None
        self.log = tmp / "worker-stderr.log"
        self._log_file: Any = None
        self.log_pos = 0
        self.died = False  # set when the last load killed the worker (reported cleanly)

    def get(self) -> Any:
        from engine.worker import client as client_mod

        if self.client is not None and self.client.proc.poll() is None:
            return self.client
        self.drop()
        client_mod.worker_command = C.worker_command  # the same worker, under the memory cap
        self._log_file = self.log.open("ab")
        self.client = client_mod.WorkerClient(stderr=self._log_file)
        return self.client

    def new_stderr(self) -> str:
        if not self.log.exists():
            return ""
        with self.log.open("rb") as f:
            f.seek(self.log_pos)
            data = f.read()
        self.log_pos += len(data)
        return data.decode("utf-8", "replace")

    def drop(self) -> None:
        if self.client is not None:
            if self.client.proc.poll() is None:
                self.client.proc.kill()
            self.client.proc.wait()
            self.client = None
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def close(self) -> None:
        if self.client is not None:
            try:
                self.client.close(timeout=5)
            except Exception:
                pass
        self.drop()


def _pinned(suffix: str, value: G.Value, what: str) -> G.Mutation:
    def mutate(rng: Any, buf: bytes) -> tuple[str, bytes]:
        g = G.parse(buf)
        key = G.set_key(g, suffix, value)
        return f"metadata {key.decode()} = {what}", G.serialize(g)
    return mutate


def _pinned_many(changes: list[tuple[str, G.Value]], what: str) -> G.Mutation:
    def mutate(rng: Any, buf: bytes) -> tuple[str, bytes]:
        g = G.parse(buf)
        for suffix, value in changes:
            G.set_key(g, suffix, value)
        return what, G.serialize(g)
    return mutate


def _declared_tensors(n: int) -> G.Mutation:
    def mutate(rng: Any, buf: bytes) -> tuple[str, bytes]:
        g = G.parse(buf)
        g.n_tensors_override = n
        return f"header declares {n} tensors", G.serialize(g)
    return mutate


def _many(n: int) -> G.Mutation:
    def mutate(rng: Any, buf: bytes) -> tuple[str, bytes]:
        g = G.parse(buf)
        for k in range(n):
            g.tensors.append(G.Tensor(b"extra.%d" % k, [1], 0, g.tensors[0].offset))
        return f"{n} extra one-element tensors", G.serialize(g)
    return mutate


# The campaign's findings (issue 17, items 5, 6 and 10), first and always: (arch, layout, name, mutation)
PINNED: list[tuple[str, str, str, G.Mutation]] = [
    ("glm4moe", "sidecar", "pinned", _pinned(".nextn_predict_layers", G.Value(G.U64, 10**9), "10^9")),
    ("glm4moe", "combined", "pinned", _pinned(".nextn_predict_layers", G.Value(G.U64, 10**9), "10^9")),
    ("glm4moe", "sidecar", "pinned", _pinned_many(
        [(".block_count", G.Value(G.U64, 10**9 + 4)), (".nextn_predict_layers", G.Value(G.U64, 10**9))],
        "block_count 10^9 + 4 with nextn_predict_layers 10^9 (consistent, huge)")),
    ("glm4moe", "combined", "pinned", _pinned(".nextn_predict_layers", G.Value(G.U32, 9), "9 (> block_count)")),
    ("glm4moe", "trunk", "pinned", _pinned(".block_count", G.Value(G.F32, float("nan")), "NaN")),
    ("glm4moe", "trunk", "pinned", _pinned(".block_count", G.Value(G.STRING, b"four"), "'four'")),
    ("glm4moe", "combined", "pinned", _pinned(".block_count", G.Value(G.ARRAY, (G.U32, [4, 5])), "[4, 5]")),
    ("glm4moe", "combined", "pinned", _pinned("split.count", G.Value(G.STRING, b"2"), "'2'")),
    ("glm4moe", "combined", "pinned", _pinned("general.alignment", G.Value(G.F32, float("nan")), "NaN")),
    ("glm4moe", "combined", "pinned", _pinned("general.alignment", G.Value(G.STRING, b"32"), "'32'")),
    ("glm4moe", "combined", "pinned", _pinned("tokenizer.ggml.bos_token_id", G.Value(G.STRING, b"1"), "'1'")),
    ("glm4moe", "combined", "pinned",
     _pinned("tokenizer.ggml.bos_token_id", G.Value(G.F64, float("nan")), "NaN")),
    ("glm4moe", "combined", "pinned",
     _pinned("tokenizer.ggml.bos_token_id", G.Value(G.ARRAY, (G.U32, [1])), "[1]")),
    ("glm4moe", "sidecar", "pinned", _pinned("chaos.nested", G._nested(3000), "arrays nested 3000 deep")),
    ("glm4moe", "combined", "pinned", _declared_tensors(10**7)),
    ("glm4moe", "sidecar", "pinned", _many(40_000)),
]


def schedule(n: int) -> list[tuple[str, G.Mutation]]:
    """Mutation kinds in a fixed rotation; the slow many-tensor files only twice (once with --quick)."""
    regular = [m for m in G.MUTATIONS if m[0] != "many-tensors"]
    many = next(m for m in G.MUTATIONS if m[0] == "many-tensors")
    out = [regular[i % len(regular)] for i in range(n)]
    for i in ((n - 1,) if n < 60 else (n // 2, n - 1)):
        out[i] = many
    return out


def run(ctx: Any, bases: dict[str, dict[str, Path]]) -> None:
    n = 20 if ctx.quick else 150
    blobs = {(arch, layout): p.read_bytes() for arch, files in bases.items() for layout, p in files.items()}
    slot = WorkerSlot(ctx.tmp)
    try:
        pinned = PINNED[:5] if ctx.quick else PINNED
        for i, (kind, mutate) in enumerate([(p[2], p[3]) for p in pinned] + schedule(n)):
            case = f"gguf-{i:03d}"
            if not ctx.wanted(case):
                continue
            rng = ctx.rng("gguf", i)
            arch = rng.choice(["glm4moe", "glm4moe", "step35"])
            layout = rng.choice(["combined", "combined", "trunk", "sidecar"])
            if kind == "chat-template":
                layout = "combined"
            if i < len(pinned):
                arch, layout = pinned[i][0], pinned[i][1]
            desc, data = mutate(rng, blobs[(arch, layout)])
            case_dir = ctx.tmp / case
            (case_dir / "models").mkdir(parents=True)
            path = case_dir / "models" / f"{layout}.gguf"
            path.write_bytes(data)
            label = f"{case} {arch}/{layout}.gguf: {desc}"
            print(f"  {label}", file=sys.stderr, flush=True)
            one_case(ctx, slot, case, label, path, layout, bases[arch])
            shutil.rmtree(case_dir, ignore_errors=True)
    finally:
        slot.close()


def one_case(ctx: Any, slot: WorkerSlot, case: str, label: str, path: Path, layout: str,
             base: dict[str, Path]) -> None:
    tally = ctx.tally
    failed = False

    def record(row: str, outcome: tuple[str, str], res: C.Result) -> None:
        nonlocal failed
        tally.record(row, case, [(outcome[0], f"{label} — {outcome[1]}" if outcome[1] else label)],
                     RETRIED if res.retried else None)
        failed = failed or outcome[0] in C.BAD

    res = C.run([*C.CLI, "info", str(path)], INFO_TIMEOUT, retry=True)
    record("gguf: info", C.classify_cli(res, "info"), res)
    pair = (base["trunk"], path) if layout == "sidecar" else (path, base["sidecar"])
    res = C.run([*C.CLI, "models", "doctor", str(pair[0]), str(pair[1])], INFO_TIMEOUT, retry=True)
    outcome = C.classify_cli(res, "doctor")
    if outcome[0] == C.OK and res.rc == 1:  # doctor: exit 1 with a report is its "does not fit"
        outcome = (C.CLEAN, "")
    record("gguf: models doctor", outcome, res)
    case_env = {"MTP_STUDIO_CONFIG_DIR": str(path.parent.parent / "config"),
                "MTP_STUDIO_DATA_DIR": str(path.parent.parent / "data")}
    res = C.run([*C.CLI, "models", "list", "--add-folder", str(path.parent)], INFO_TIMEOUT, env=case_env,
                retry=True)
    outcome = C.classify_cli(res, "models list")
    if outcome[0] == C.OK and str(path) not in res.out:
        outcome = (C.OTHER, "models list does not show the file")
    elif outcome[0] == C.OK and "unreadable" in res.out:
        outcome = (C.CLEAN, "")
    record("gguf: models list", outcome, res)
    slot.died = False
    outcome = worker_load(slot, path, layout, base)
    tally.record("gguf: worker load", case, [(outcome[0], f"{label} — {outcome[1]}")],
                 "the worker died and the client reported it" if slot.died else None)
    failed = failed or outcome[0] in C.BAD
    if failed:
        ctx.keep_file(case, path)


def worker_load(slot: WorkerSlot, path: Path, layout: str, base: dict[str, Path]) -> tuple[str, str]:
    """Load the file in the worker (as target, or as the sidecar of the good trunk) and draft a short reply."""
    from engine.worker import protocol as P
    from engine.worker.client import WorkerDied

    client = slot.get()
    slot.new_stderr()
    target, sidecar = (str(base["trunk"]), str(path)) if layout == "sidecar" else (str(path), None)
    outcome: tuple[str, str] = (C.OK, "")
    try:
        options = P.LoadOptions(path=target, sidecar=sidecar, n_ctx=512, n_threads=1, mtp=True)
        events = client.call(P.LoadRequest(id=client.new_id(), options=options), timeout=LOAD_TIMEOUT)
        final = events[-1]
        if isinstance(final, P.ErrorEvent):
            outcome = ((C.TRACEBACK, f"load: internal error {final.message}") if final.kind == "internal"
                       else (C.CLEAN, f"load: [{final.kind}] {final.message}"))
        else:
            outcome = reply(client, final)
    except TimeoutError:
        outcome = (C.HANG, f"the worker gave no final event within {LOAD_TIMEOUT:.0f} s")
        slot.drop()
    except WorkerDied as exc:
        outcome = (C.CLEAN, f"worker died, reported: {exc}")  # the client said so; the next case gets a new one
        slot.died = True
        slot.drop()
    err = slot.new_stderr()
    if C.has_traceback(err) and outcome[0] not in C.BAD:
        outcome = (C.TRACEBACK, f"worker stderr: {C.last_line(err)}")
    if slot.client is not None:
        try:
            slot.client.call(P.UnloadRequest(id=slot.client.new_id()), timeout=20)
        except (TimeoutError, WorkerDied):
            slot.drop()
    return outcome


def reply(client: Any, loaded: Any) -> tuple[str, str]:
    """Two short replies after a load: a raw prompt (drafting where the model can) and through the template."""
    from engine.speculative.settings import SPECULATION_OFF, SpeculativeSettings
    from engine.worker import protocol as P

    spec = SpeculativeSettings("mtp", 2, 0, 0.0) if loaded.model.max_draft > 0 else SPECULATION_OFF
    requests = [P.GenerateRequestMsg(id=client.new_id(), prompt="once upon a time", max_tokens=8,
                                     speculative=spec)]
    if loaded.model.has_chat_template:
        requests.append(P.GenerateRequestMsg(id=client.new_id(), messages=[{"role": "user", "content": "hi"}],
                                             max_tokens=4))
    result: tuple[str, str] = (C.OK, "loaded and replied")
    for req in requests:
        client.send(req)
        try:
            events = list(client.events_until_done(req.id, timeout=REPLY_TIMEOUT))
        except TimeoutError:
            client.send(P.CancelRequest(id=client.new_id(), target=req.id))
            try:
                list(client.events_until_done(req.id, timeout=10))
                return C.HANG, f"generate: nothing for {REPLY_TIMEOUT:.0f} s until cancelled"
            except TimeoutError:
                client.proc.kill()
                return C.HANG, f"generate: nothing for {REPLY_TIMEOUT:.0f} s, and cancel did not stop it"
        for ev in events:
            if isinstance(ev, P.ErrorEvent):
                if ev.kind == "internal":
                    return C.TRACEBACK, f"generate: internal error {ev.message}"
                if ev.kind != "speculative_unavailable":
                    result = (C.CLEAN, f"generate: [{ev.kind}] {ev.message}")
    return result
