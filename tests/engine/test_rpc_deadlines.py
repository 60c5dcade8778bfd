"""RPC deadlines (issue 31, item 6): the probe is bounded as a whole, and ggml's own connection gets
keepalive and a reply timeout, so a server that trickles, lies about its devices or stops answering
mid-reply ends in a clear error in bounded time instead of a hang.

The fake servers are loopback sockets served by a thread in the test; the last test runs the real
ggml-rpc-server (skipped or failed as in tests/engine/test_rpc.py)."""

from __future__ import annotations

import os
import signal
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from engine.rpc.endpoints import Endpoint
from engine.rpc.probe import MAX_DEVICES, bound_client_connections, probe
from engine.worker import protocol as P
from engine.worker.client import WorkerClient, WorkerDied
from tests.fake_rpc import HELLO, read_command, reply


class FakeServer:
    """Accepts one client at a time and runs ``script(conn)`` on it, in a thread."""

    def __init__(self, script: Callable[[socket.socket], None]) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = Endpoint("127.0.0.1", self.listener.getsockname()[1])
        self.script = script
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with conn:
                try:
                    self.script(conn)
                except OSError:
                    pass  # the probe hung up: what it should do at its deadline

    def close(self) -> None:
        self.stop.set()
        self.listener.close()
        self.thread.join(5)


@pytest.fixture()
def fake() -> Iterator[Callable[[Callable[[socket.socket], None]], FakeServer]]:
    made: list[FakeServer] = []

    def make(script: Callable[[socket.socket], None]) -> FakeServer:
        made.append(FakeServer(script))
        return made[-1]

    yield make
    for server in made:
        server.close()


def _timed_probe(server: FakeServer, timeout_s: float):
    start = time.monotonic()
    found = probe(server.endpoint, timeout_s=timeout_s)
    return found, time.monotonic() - start


def test_a_hello_trickled_a_byte_at_a_time_ends_the_probe_at_its_deadline(fake):
    """Each byte comes well within the old per-read limit; before, the probe waited for all of them."""
    def trickle(conn: socket.socket) -> None:
        read_command(conn)
        for byte in reply(HELLO):
            conn.sendall(bytes([byte]))
            time.sleep(0.2)  # 36 bytes: 7 s in all

    found, took = _timed_probe(fake(trickle), 1.5)
    assert not found.ok and found.status == "incompatible" and "greeting" in found.message, found
    assert took < 2.5, took


def test_a_server_announcing_four_billion_devices_is_refused_at_once(fake):
    """2^32-1 devices: before, the probe asked each one's memory, 3 s per read, for ever."""
    def absurd(conn: socket.socket) -> None:
        read_command(conn)
        conn.sendall(reply(HELLO))
        read_command(conn)
        conn.sendall(reply(struct.pack("<I", 2**32 - 1)))
        while True:  # answers every memory question, a little slowly
            read_command(conn)
            time.sleep(0.05)
            conn.sendall(reply(struct.pack("<QQ", 1 << 30, 1 << 31)))

    found, took = _timed_probe(fake(absurd), 3.0)
    assert found.status == "incompatible" and f"{2**32 - 1:,} devices" in found.message, found
    assert str(MAX_DEVICES) in found.message and took < 1.0, took


def test_many_slow_device_answers_end_at_the_whole_probes_deadline(fake):
    """A plausible count (200), each answer 0.1 s: 20 s in all, bounded by the probe's 1.5 s."""
    def slow(conn: socket.socket) -> None:
        read_command(conn)
        conn.sendall(reply(HELLO))
        read_command(conn)
        conn.sendall(reply(struct.pack("<I", 200)))
        while True:
            read_command(conn)
            time.sleep(0.1)
            conn.sendall(reply(struct.pack("<QQ", 1 << 30, 1 << 31)))

    found, took = _timed_probe(fake(slow), 1.5)
    assert found.status == "dead" and "within 1.5 s" in found.message, found
    assert took < 2.5, took


def test_a_server_that_never_answers_is_busy_within_the_deadline(fake):
    found, took = _timed_probe(fake(lambda conn: time.sleep(10)), 1.0)
    assert found.status == "busy" and took < 2.0, (found, took)


def test_a_client_connection_gets_keepalive_and_a_reply_timeout(fake):
    """What is done to ggml's socket, on a plain one: the options are set on the shared socket, and a
    server that goes silent makes a read fail after the reply timeout instead of blocking for ever."""
    server = fake(lambda conn: time.sleep(10))
    client = socket.create_connection((server.endpoint.host, server.endpoint.port))
    with client:
        assert bound_client_connections(server.endpoint, reply_timeout_s=0.5) == 1
        assert client.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        if hasattr(socket, "TCP_USER_TIMEOUT"):
            assert client.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) > 0
        start = time.monotonic()
        with pytest.raises(OSError):  # EAGAIN from the kernel: ggml's recv_data fails and ggml aborts
            client.recv(1)
        assert 0.3 < time.monotonic() - start < 3


def test_a_stopped_server_ends_the_reply_with_an_rpc_error_in_bounded_time(monkeypatch):
    """The real thing: a model split over ggml-rpc-server, whose process is then SIGSTOPped. The host
    still acknowledges every packet, so only the reply timeout can tell; before, the reply waited for ever."""
    from tests.engine.conftest import synth
    from tests.engine.test_rpc import MTP, PROMPT, Servers, server_binary

    monkeypatch.setenv("MTP_STUDIO_RPC_REPLY_TIMEOUT_S", "3")  # the worker inherits it
    model = synth("glm4moe", weights="mixed", agree=0.7, reads="hidden")
    pool = Servers(server_binary(), 1)
    proc = pool.procs[0]
    assert proc is not None
    try:
        with WorkerClient() as worker:
            options = P.LoadOptions(path=str(model.path("combined")), n_ctx=2048, rpc=tuple(pool.endpoints))
            load = P.LoadRequest(id=worker.new_id(), options=options)
            assert isinstance(worker.call(load)[-1], P.LoadedEvent)
            worker.send(P.GenerateRequestMsg(id="g", prompt=PROMPT, max_tokens=1500, speculative=MTP))
            seen: list[P.Event] = []
            start = None
            for ev in worker.events_until_done("g", timeout=60):
                seen.append(ev)
                if isinstance(ev, P.TokenEvent) and start is None:
                    os.kill(proc.pid, signal.SIGSTOP)
                    start = time.monotonic()
            assert start is not None, seen
            errors = [e for e in seen if isinstance(e, P.ErrorEvent)]
            assert errors and errors[0].kind == "rpc", seen
            assert isinstance(seen[-1], P.DoneEvent) and seen[-1].finish_reason == "error"
            assert time.monotonic() - start < 20
            with pytest.raises(WorkerDied):
                worker.next_event(timeout=30)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
        pool.close()


def test_stop_during_a_wait_on_a_stopped_server_ends_the_reply_at_its_deadline(monkeypatch):
    """Stop is a flag the decode loop reads between steps; a decode inside ggml's RPC client waiting on a
    SIGSTOPped server never got there, so Stop waited for the 300 s reply timeout. Now the worker shuts
    the connection down at Stop's deadline: the reply ends, cancelled, with an rpc error saying why."""
    from tests.engine.conftest import synth
    from tests.engine.test_rpc import MTP, PROMPT, Servers, server_binary

    monkeypatch.setenv("MTP_STUDIO_RPC_STOP_DEADLINE_S", "2")  # the worker inherits it; the reply timeout stays 300 s
    model = synth("glm4moe", weights="mixed", agree=0.7, reads="hidden")
    pool = Servers(server_binary(), 1)
    proc = pool.procs[0]
    assert proc is not None
    try:
        with WorkerClient() as worker:
            options = P.LoadOptions(path=str(model.path("combined")), n_ctx=2048, rpc=tuple(pool.endpoints))
            assert isinstance(worker.call(P.LoadRequest(id=worker.new_id(), options=options))[-1], P.LoadedEvent)
            worker.send(P.GenerateRequestMsg(id="g", prompt=PROMPT, max_tokens=1500, speculative=MTP))
            while not isinstance(worker.next_event(timeout=60), P.TokenEvent):
                pass
            os.kill(proc.pid, signal.SIGSTOP)
            quiet_since = time.monotonic()
            while time.monotonic() - quiet_since < 1.0:  # what was already on its way; then it waits
                try:
                    ev = worker.next_event(timeout=1.0)
                except TimeoutError:
                    break
                assert not isinstance(ev, P.DoneEvent), ev
                quiet_since = time.monotonic()
            worker.send(P.CancelRequest(id="stop", target="g"))
            start = time.monotonic()
            seen = list(worker.events_until_done("g", timeout=30))  # before: nothing for 300 s
            took = time.monotonic() - start
            errors = [e for e in seen if isinstance(e, P.ErrorEvent)]
            assert errors and errors[0].kind == "rpc" and "Stop could not end the reply" in errors[0].message, seen
            assert isinstance(seen[-1], P.DoneEvent) and seen[-1].finish_reason == "cancelled", seen
            assert 1.5 < took < 10, took
            with pytest.raises(WorkerDied):  # ggml aborts on the shut connection; the app restarts the worker
                while True:
                    worker.next_event(timeout=30)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
        pool.close()
