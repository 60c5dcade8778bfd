"""A model split across machines with ggml's RPC backend, on loopback.

Two ``ggml-rpc-server`` processes on 127.0.0.1 stand in for two remote
machines. A synthetic model split across them and this process's CPU must
give exactly the tokens of the local run, plain and with MTP (the MTP head
and its KV cache stay local), and a server killed mid-reply must end the
reply with a clear ``rpc`` error, the worker must exit (the app restarts
it), and a new worker must reconnect to the restarted server.

The server binary comes from ``packaging/build_reference_driver.py`` (built
with the engine's own sdist, so it speaks the engine's RPC protocol):
``bootstrap.sh --test`` records it, and then a missing one is a failure,
not a skip. ``MTP_STUDIO_RPC_SERVER`` names another (with
``LLAMA_CPP_LIB_PATH`` pointing at an RPC-enabled libllama during
development).
"""

from __future__ import annotations

import collections
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.errors import RpcError
from engine.generation.generator import GenerateRequest, generate
from engine.generation.session import LoadOptions, Session
from engine.rpc import parse_endpoints
from engine.rpc.probe import probe
from engine.runtime import native
from engine.speculative.settings import SPECULATION_OFF, SpeculativeSettings
from engine.worker import protocol as P
from engine.worker.client import WorkerClient, WorkerDied
from tests.engine.conftest import synth

PACKAGING = Path(__file__).resolve().parents[2] / "packaging"
PROMPT = " the river model"
MTP = SpeculativeSettings("mtp", 3, 0, 0.0)


def _server_binary() -> Path:
    env = os.environ.get("MTP_STUDIO_RPC_SERVER")
    if env:
        return Path(env)
    sys.path.insert(0, str(PACKAGING))
    import build_engine  # type: ignore[import-not-found]
    import build_reference_driver as brd  # type: ignore[import-not-found]

    record_path = Path(sys.prefix) / brd.RECORD_NAME
    if record_path.exists():
        record = json.loads(record_path.read_text())
        binary = Path(record.get("rpc_server", ""))
        if not record.get("rpc_server") or not binary.is_file():
            pytest.fail(f"bootstrap's record {record_path} names no ggml-rpc-server (or it is gone): "
                        "run ./packaging/bootstrap.sh --test again")
        engine = Path(sys.prefix) / build_engine.BUILD_RECORD_NAME
        engine_key = json.loads(engine.read_text()).get("cache_key") if engine.exists() else None
        if engine_key != record["cache_key"]:
            pytest.fail(f"ggml-rpc-server was built for {record['cache_key']} but the engine installed is "
                        f"{engine_key}: run ./packaging/bootstrap.sh --test again")
        return binary
    binary = brd.rpc_server_path("cpu")
    if binary.is_file():
        return binary
    pytest.skip("ggml-rpc-server is not built and this environment was not set up by ./packaging/bootstrap.sh "
                "--test (the README's test command builds it); or set MTP_STUDIO_RPC_SERVER")


def _require_rpc_engine() -> None:
    """Fail where the set-up promised an RPC-enabled engine, skip where it predates that.

    Asked in a child process: the GUI tests use this too, and their process never loads llama.cpp."""
    from engine.runtime import native

    code = "from engine.runtime import rpc; print(rpc.supported())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    if out.stdout.strip().endswith("True"):
        return
    args = native.build_info().get("cmake_args") or []
    if "-DGGML_RPC=ON" in args or os.environ.get("MTP_STUDIO_RPC_SERVER"):
        pytest.fail("the engine's libllama has no RPC backend although its build asked for one "
                    f"(LLAMA_CPP_LIB_PATH={os.environ.get('LLAMA_CPP_LIB_PATH')})")
    pytest.skip("the installed engine was built before -DGGML_RPC=ON: run ./packaging/bootstrap.sh --test")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Servers:
    """ggml-rpc-server processes on loopback, one per port."""

    def __init__(self, binary: Path, n: int) -> None:
        self.binary = binary
        self.ports = [_free_port() for _ in range(n)]
        self.procs: list[subprocess.Popen[bytes] | None] = [None] * n
        for i in range(n):
            self.start(i)

    def start(self, i: int) -> None:
        self.procs[i] = subprocess.Popen([str(self.binary), "--host", "127.0.0.1", "--port", str(self.ports[i]),
                                          "--threads", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        endpoint = parse_endpoints(self.endpoint(i))[0]
        deadline = time.monotonic() + 30
        while not probe(endpoint, timeout_s=1).ok:
            assert self.procs[i].poll() is None, f"ggml-rpc-server on port {self.ports[i]} exited"
            assert time.monotonic() < deadline, f"ggml-rpc-server on port {self.ports[i]} never answered"
            time.sleep(0.1)

    def kill(self, i: int) -> None:
        proc = self.procs[i]
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

    def endpoint(self, i: int) -> str:
        return f"127.0.0.1:{self.ports[i]}"

    @property
    def endpoints(self) -> list[str]:
        return [self.endpoint(i) for i in range(len(self.ports))]

    def close(self) -> None:
        for i in range(len(self.ports)):
            self.kill(i)


def server_binary() -> Path:
    """The ggml-rpc-server the tests run, once the engine is known to have RPC (else fail or skip)."""
    _require_rpc_engine()
    return _server_binary()


@pytest.fixture(scope="module")
def binary() -> Path:
    return server_binary()


@pytest.fixture(scope="module")
def servers(binary: Path) -> Iterator[Servers]:
    pool = Servers(binary, 2)
    yield pool
    pool.close()


@pytest.fixture()
def long_log(monkeypatch) -> None:
    """Keep every native log line of the test: a load's buffer lines are far back in a 200-line tail."""
    monkeypatch.setattr(native, "_log_tail", collections.deque(maxlen=100_000))


def _tokens(session: Session, spec: SpeculativeSettings, n: int = 40) -> list[int]:
    return list(generate(session, GenerateRequest(prompt=PROMPT, max_tokens=n, speculative=spec)).tokens)


def test_the_probe_lists_each_servers_device_and_a_closed_port_says_what_to_do(servers: Servers):
    found = probe(parse_endpoints(servers.endpoint(0))[0])
    assert found.ok and found.version.startswith("7.") and len(found.devices) == 1
    assert found.devices[0].total > 0
    dead = probe(parse_endpoints(f"127.0.0.1:{_free_port()}")[0], timeout_s=1)
    assert dead.status == "dead" and "mtp-studio rpc-server" in dead.message


@pytest.mark.parametrize("arch", ["glm4moe", "qwen35"])
def test_a_split_model_gives_the_local_tokens_plain_and_with_mtp(servers: Servers, arch: str, long_log):
    """glm4moe (attention) and qwen35 (hybrid: recurrent state and snapshots) across both
    servers and the local CPU; the MTP block and the output layer stay local."""
    model = synth(arch, weights="mixed", agree=0.7, reads="hidden")
    path = str(model.path("combined"))
    with Session(LoadOptions(path=path, n_ctx=256)) as local:
        want_plain, want_mtp = _tokens(local, SPECULATION_OFF), _tokens(local, MTP)
    assert want_plain == want_mtp
    with Session(LoadOptions(path=path, n_ctx=256, rpc=tuple(servers.endpoints))) as split_session:
        lines = split_session.placement.lines
        assert lines[0].startswith("RPC") and lines[1].startswith("RPC"), lines  # each server holds blocks
        assert "MTP head" in lines[-1] and "output" in lines[-1] and "this machine" in lines[-1], lines
        assert split_session.mtp_drafter is not None
        # llama.cpp's own account: the trunk's KV cache is on the servers, the MTP context's (made last) here
        kv = native.recent_log(50, contains="KV buffer size")
        assert any("RPC" in line for line in kv) and "RPC" not in kv[-1] and "CPU" in kv[-1], kv
        assert _tokens(split_session, SPECULATION_OFF) == want_plain
        assert _tokens(split_session, MTP) == want_plain


def test_a_sidecar_head_stays_local_while_the_trunk_is_split(servers: Servers, long_log):
    model = synth("glm4moe", weights="mixed", agree=0.7, reads="hidden")
    trunk, side = str(model.path("trunk")), str(model.path("sidecar"))
    with Session(LoadOptions(path=trunk, sidecar=side, n_ctx=256)) as local:
        want = _tokens(local, SPECULATION_OFF)
    with Session(LoadOptions(path=trunk, sidecar=side, n_ctx=256, rpc=tuple(servers.endpoints))) as split_session:
        assert all("MTP head" not in line for line in split_session.placement.lines)  # not in the trunk file
        weights = native.recent_log(50, contains="model buffer size")  # the sidecar is loaded last: all here
        assert any("RPC" in line for line in weights) and "RPC" not in weights[-1], weights
        assert _tokens(split_session, MTP) == want


def test_a_tensor_split_is_followed_and_must_name_every_device(servers: Servers):
    model = synth("glm4moe", weights="mixed", agree=0.7, reads="hidden")
    path = str(model.path("combined"))
    with pytest.raises(RpcError, match="3 non-negative shares"):
        Session(LoadOptions(path=path, n_ctx=256, rpc=tuple(servers.endpoints), tensor_split=(1.0, 1.0)))
    # everything on the first server but the MTP block and output, which the engine keeps local
    with Session(LoadOptions(path=path, n_ctx=256, rpc=tuple(servers.endpoints),
                             tensor_split=(1.0, 0.0, 0.0))) as s:
        assert s.placement.lines[0].startswith("RPC0") and "blocks 0-3" in s.placement.lines[0]
        assert "MTP head" in s.placement.lines[-1]


def test_the_rpc_server_command_warns_binds_loopback_and_serves(binary: Path):
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "engine", "rpc-server", "--port", str(port), "--binary", str(binary),
                             "--threads", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        endpoint = parse_endpoints(f"127.0.0.1:{port}")[0]
        deadline = time.monotonic() + 30
        while not probe(endpoint, timeout_s=1).ok:
            assert proc.poll() is None and time.monotonic() < deadline, "mtp-studio rpc-server did not serve"
            time.sleep(0.1)
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert "no authentication and no encryption" in err
    assert f"--host 127.0.0.1 --port {port}" in err  # loopback unless told otherwise
    assert "not on loopback" not in err


def test_models_fit_divides_the_estimate_as_the_load_places_the_blocks(servers: Servers):
    from engine.store.fit_split import split_estimate

    model = synth("glm4moe", weights="mixed", agree=0.7, reads="hidden")
    path = str(model.path("combined"))
    with Session(LoadOptions(path=path, n_ctx=256, rpc=tuple(servers.endpoints), tensor_split=(3.0, 1.0, 1.0))) as s:
        placed = [line.rsplit(": ", 1)[1] for line in s.placement.lines]
    devices = [(f"RPC{i}", 2**34) for i in range(2)] + [("here", 2**34)]
    est, shares = split_estimate(path, devices, n_ctx=256, tensor_split=[3.0, 1.0, 1.0])
    assert [share.blocks for share in shares] == placed
    assert sum(share.needed for share in shares) >= est.weights  # every tensor is somewhere
    assert shares[-1].needed > est.mtp_context  # the MTP context is charged here


def _load(worker: WorkerClient, path: str, rpc: list[str]) -> P.Event:
    options = P.LoadOptions(path=path, n_ctx=2048, rpc=tuple(rpc))
    return worker.call(P.LoadRequest(id=worker.new_id(), options=options))[-1]


def test_a_dead_server_at_load_is_a_clear_error_and_the_worker_lives_on(binary: Path):
    model = synth("glm4moe", weights="mixed", agree=0.7, reads="hidden")
    with WorkerClient() as worker:
        ev = _load(worker, str(model.path("combined")), [f"127.0.0.1:{_free_port()}"])
        assert isinstance(ev, P.ErrorEvent) and ev.kind == "rpc" and "cannot connect" in ev.message, ev
        assert isinstance(_load(worker, str(model.path("combined")), []), P.LoadedEvent)  # still serving


def test_a_server_killed_mid_reply_ends_it_clearly_and_a_new_worker_reconnects(binary: Path):
    model = synth("glm4moe", weights="mixed", agree=0.7, reads="hidden")
    path = str(model.path("combined"))
    pool = Servers(binary, 2)
    try:
        with WorkerClient() as worker:
            assert isinstance(_load(worker, path, pool.endpoints), P.LoadedEvent)
            worker.send(P.GenerateRequestMsg(id="g", prompt=PROMPT, max_tokens=1500, speculative=MTP))
            seen: list[P.Event] = []
            n_tokens = 0
            for ev in worker.events_until_done("g", timeout=120):
                seen.append(ev)
                if isinstance(ev, P.TokenEvent):
                    n_tokens += 1
                    if n_tokens == 5:
                        pool.kill(1)
            errors = [e for e in seen if isinstance(e, P.ErrorEvent)]
            assert errors and errors[0].kind == "rpc" and "stopped answering" in errors[0].message, seen
            assert isinstance(seen[-1], P.DoneEvent) and seen[-1].finish_reason == "error"
            with pytest.raises(WorkerDied):  # ggml ends the process; the app restarts it
                worker.next_event(timeout=30)
        pool.start(1)  # the host is back
        with WorkerClient() as worker:
            assert isinstance(_load(worker, path, pool.endpoints), P.LoadedEvent)
            done = worker.call(P.GenerateRequestMsg(id="again", prompt=PROMPT, max_tokens=8, speculative=MTP))[-1]
            assert isinstance(done, P.DoneEvent) and done.finish_reason == "length"
    finally:
        pool.close()
