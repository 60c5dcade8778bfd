"""The worker ends with the app that started it (issue 31, item 2): killed,
terminated or gone quietly, with stderr a pipe nobody reads any more, the
worker and the model it holds are gone within 5 s (docs/protocol.md).

Each case runs the real worker under a real parent process: a small Python
program that starts it as the app does (``WorkerClient``, stderr a pipe),
loads the synthetic model, says the worker's pid and waits to be killed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.engine.conftest import synth

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="kills processes with POSIX signals")

GONE_WITHIN_S = 5.0
ROOT = Path(__file__).resolve().parents[2]

# The "app": starts the worker with stderr a pipe (never read), loads a model, prints the pid, waits.
# With HOLD_STDIN, another process holds the worker's stdin open too, so its end never comes: only
# the parent-death signal (or the watchdog) can end the worker.
PARENT = textwrap.dedent("""
    import subprocess, sys, time
    from engine.worker import protocol as P
    from engine.worker.client import WorkerClient

    client = WorkerClient(stderr=subprocess.PIPE)
    loaded = client.call(P.LoadRequest(id="load", options=P.LoadOptions(path=sys.argv[1], n_ctx=512)), timeout=120)[-1]
    assert loaded.type == "loaded", loaded
    if sys.argv[2] == "hold-stdin":
        subprocess.Popen(["sleep", "300"], pass_fds=[client.proc.stdin.fileno()])
    print(client.proc.pid, flush=True)
    time.sleep(600)
""")


def running(pid: int) -> bool:
    """Is ``pid`` a live process (a zombie waiting to be reaped has let go of everything: not live)?"""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:  # no /proc (macOS): ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while running(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def start_parent(model: str, mode: str = "plain") -> tuple[subprocess.Popen[str], int]:
    parent = subprocess.Popen([sys.executable, "-c", PARENT, model, mode], cwd=ROOT, stdout=subprocess.PIPE,
                              text=True)
    assert parent.stdout is not None
    line = parent.stdout.readline()
    assert line.strip().isdigit(), f"the parent did not start a worker (exit {parent.wait(30)})"
    return parent, int(line)


@pytest.fixture(scope="module")
def model() -> str:
    return str(synth("glm4moe").path("combined"))


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_the_worker_is_gone_within_5_s_of_its_parent_being_killed(model, sig):
    parent, worker = start_parent(model)
    try:
        assert running(worker)
        parent.send_signal(sig)
        parent.wait(10)
        assert gone_within(worker, GONE_WITHIN_S), f"the worker {worker} outlived its parent by {GONE_WITHIN_S} s"
    finally:
        parent.kill()
        if running(worker):
            os.kill(worker, signal.SIGKILL)


def test_a_worker_whose_stdin_closes_exits_even_when_its_stderr_pipe_is_broken(model):
    """The parent lives on here, so no parent-death guard helps: ending on stdin's end must survive
    the diagnostic it writes to a stderr nobody reads (that write raised BrokenPipeError and killed
    the thread that ends the worker)."""
    proc = subprocess.Popen([sys.executable, "-m", "engine.worker"], cwd=ROOT, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdin is not None and proc.stderr is not None
        assert json.loads(proc.stdout.readline())["type"] == "ready"
        proc.stderr.close()  # the reader of stderr is gone
        proc.stdin.close()  # and so is the app's end of the protocol
        proc.wait(GONE_WITHIN_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the worker still runs {GONE_WITHIN_S} s after its stdin closed")
    finally:
        proc.kill()
        proc.wait()


# Runs the parent as its own child and, as a "subreaper", inherits the orphaned worker: so it can
# wait for it and see how it ended. SIGKILL is the parent-death signal's mark (the worker's own
# ways out exit with code 0).
SUPERVISOR = textwrap.dedent("""
    import ctypes, json, os, signal, subprocess, sys, time
    PR_SET_CHILD_SUBREAPER = 36
    assert ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    parent = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2], "hold-stdin"],
                              stdout=subprocess.PIPE, text=True)
    worker = int(parent.stdout.readline())
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    t0, status = time.monotonic(), None
    while time.monotonic() - t0 < 10:
        pid, code = os.waitpid(-1, os.WNOHANG)
        if pid == worker:
            status = -os.WTERMSIG(code) if os.WIFSIGNALED(code) else os.WEXITSTATUS(code)
            break
        time.sleep(0.02)
    print(json.dumps({"status": status, "seconds": time.monotonic() - t0}), flush=True)
    if status is None:
        os.kill(worker, signal.SIGKILL)
    os.killpg(0, signal.SIGKILL) if os.getpgid(0) == os.getpid() else None
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_the_kernel_kills_the_worker_with_its_parent_even_while_its_stdin_stays_open(model):
    supervisor = subprocess.run([sys.executable, "-c", SUPERVISOR, PARENT, model], cwd=ROOT, capture_output=True,
                                text=True, timeout=180, start_new_session=True)
    assert supervisor.returncode in (0, -signal.SIGKILL), supervisor.stderr
    result = json.loads(supervisor.stdout.splitlines()[0])
    assert result["status"] == -signal.SIGKILL, result  # the parent-death signal, not the 1 s watchdog
    assert result["seconds"] < GONE_WITHIN_S
