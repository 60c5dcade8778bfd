"""Shared pieces of the chaos run: outcomes, the tally and its table, and a
subprocess runner with a time limit, a memory cap and a process-group kill."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository
VENV_BIN = Path(sys.executable).parent
CLI = [sys.executable, "-m", "engine"]  # the same entry point as `mtp-studio`

OK, CLEAN, TRACEBACK, CRASH, HANG, CORRUPT, LOST, OTHER = (
    "ok", "clean error", "traceback", "crash", "hang", "corrupt file", "lost reply", "other failure")
BAD = (TRACEBACK, CRASH, HANG, CORRUPT, LOST, OTHER)
COLUMNS = (OK, CLEAN, *BAD)
HEADINGS = {OK: "ok", CLEAN: "clean errors", TRACEBACK: "tracebacks", CRASH: "crashes", HANG: "hangs",
            CORRUPT: "corrupt files", LOST: "lost replies", OTHER: "other failures"}

CLI_MEMORY = 3 << 30  # address-space cap for info/doctor/list/download children
WORKER_MEMORY = 4 << 30  # for worker processes started by the script


@dataclass
class Failure:
    row: str
    case: str
    outcome: str
    detail: str


@dataclass
class Tally:
    rows: dict[str, Counter] = field(default_factory=dict)
    notes: dict[str, Counter] = field(default_factory=dict)
    failures: list[Failure] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    verbose: bool = False

    def record(self, row: str, case: str, outcomes: list[tuple[str, str]], note: str | None = None) -> None:
        """One case: its outcomes as (outcome, detail); any bad outcome makes the case a failure."""
        counts = self.rows.setdefault(row, Counter())
        counts["cases"] += 1
        bad = [(o, d) for o, d in outcomes if o in BAD]
        if self.verbose:
            for o, d in outcomes:
                print(f"    {row}: {o}: {d}", file=sys.stderr, flush=True)
        for o, d in bad:
            counts[o] += 1
            self.failures.append(Failure(row, case, o, d))
        if not bad:
            counts[CLEAN if any(o == CLEAN for o, _ in outcomes) else OK] += 1
        if note:
            self.notes.setdefault(row, Counter())[note] += 1

    def bad_total(self) -> int:
        return sum(c[o] for c in self.rows.values() for o in BAD)

    def table(self) -> str:
        head = ["category", "cases", *(HEADINGS[c] for c in COLUMNS)]
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        total: Counter = Counter()
        for row, counts in self.rows.items():
            total.update(counts)
            lines.append("| " + " | ".join([row, str(counts["cases"]), *(str(counts[c]) for c in COLUMNS)]) + " |")
        lines.append("| " + " | ".join(["**total**", str(total["cases"]), *(str(total[c]) for c in COLUMNS)])
                     + " |")
        return "\n".join(lines)


@dataclass
class Result:
    rc: int | None
    out: str
    err: str
    timed_out: bool
    seconds: float
    retried: bool = False  # the first try timed out; this is the second


def limit_memory(limit: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def run(cmd: list[str], timeout: float, env: dict[str, str] | None = None, memory: int = CLI_MEMORY,
        cwd: Path | None = None, retry: bool = False) -> Result:
    """Run ``cmd`` in its own process group; on timeout kill the whole group.

    With ``retry``, a run that times out is run once more (a stall of a shared machine is not a hang of
    the program; a real hang repeats); the result says so, and callers note it under the table.
    """
    res = _run(cmd, timeout, env, memory, cwd)
    if res.timed_out and retry:
        res = _run(cmd, timeout, env, memory, cwd)
        res.retried = True
    return res


def _run(cmd: list[str], timeout: float, env: dict[str, str] | None, memory: int, cwd: Path | None) -> Result:
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            env={**os.environ, **(env or {})}, cwd=cwd or ROOT, start_new_session=True,
                            preexec_fn=lambda: limit_memory(memory))
    try:
        out, err = proc.communicate(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        kill_group(proc)
        out, err = proc.communicate()
        timed_out = True
    return Result(proc.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"), timed_out,
                  time.monotonic() - start)


def kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def has_traceback(text: str) -> bool:
    return "Traceback (most recent call last)" in text


def last_line(text: str, limit: int = 160) -> str:
    lines = [x for x in text.strip().splitlines() if x.strip()]
    return (lines[-1] if lines else "")[:limit]


def classify_cli(res: Result, what: str) -> tuple[str, str]:
    """A command-line run: hang, crash (signal), traceback, ok (0), or a clean error (a message, no traceback)."""
    if res.timed_out:
        return HANG, f"{what}: no answer within {res.seconds:.0f} s"
    if res.rc is not None and res.rc < 0:
        return CRASH, f"{what}: killed by signal {-res.rc}; stderr: {last_line(res.err)}"
    if has_traceback(res.err) or has_traceback(res.out):
        return TRACEBACK, f"{what}: exit {res.rc}, {last_line(res.err)}"
    if res.rc == 0:
        return OK, ""
    if not (res.err.strip() or res.out.strip()):
        return OTHER, f"{what}: exit {res.rc} without a message"
    return CLEAN, last_line(res.err or res.out)


def worker_command() -> list[str]:
    """``python -m engine.worker`` under the script's memory cap."""
    code = ("import resource, runpy; "
            f"resource.setrlimit(resource.RLIMIT_AS, ({WORKER_MEMORY}, {WORKER_MEMORY})); "
            "runpy.run_module('engine.worker', run_name='__main__', alter_sys=True)")
    return [sys.executable, "-c", code]


def children(pid: int) -> list[int]:
    """Direct child processes of ``pid`` (Linux /proc)."""
    out: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(x) for x in f.read().split()]
    except OSError:
        pass
    return out


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    except OSError:
        return False


def describe_exit(code: int | None) -> str:
    from engine.worker.client import describe_exit as describe

    return describe(code)
