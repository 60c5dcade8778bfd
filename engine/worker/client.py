"""A blocking client for the worker process, for the CLI, benchmarks and tests.

The GUI has its own client (``app.engine_client``, on ``app.process``); both speak
the same protocol and start the worker the same way.
"""

from __future__ import annotations

import itertools
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

from engine.errors import EngineError, ProtocolError
from engine.worker import protocol
from engine.worker.events import ErrorEvent, Event, ReadyEvent, is_final


class WorkerDied(EngineError):
    """The worker process ended unexpectedly (a native crash, a kill)."""

    kind = "worker_died"


def worker_command() -> list[str]:
    return [sys.executable, "-m", "engine.worker"]


def describe_exit(code: int | None, what: str = "the engine process") -> str:
    """A sentence for how a child process ended (negative codes are signals on POSIX)."""
    if code is None:
        return f"{what} is still running"
    if code < 0:
        import signal

        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        hint = {
            "SIGILL": " (an illegal CPU instruction: the engine was built for another CPU; rebuild it)",
            "SIGKILL": " (killed, possibly by the system running out of memory)",
            "SIGSEGV": " (a crash inside llama.cpp, often a malformed model file)",
            "SIGABRT": " (llama.cpp aborted, often on a failed internal check)",
        }.get(name, "")
        return f"{what} was stopped by {name}{hint}"
    return f"{what} exited with code {code}"


class WorkerClient:
    """Starts ``python -m engine.worker`` and exchanges protocol lines with it."""

    def __init__(self, env: dict[str, str] | None = None, stderr: Any = None) -> None:
        self._ids = itertools.count(1)
        self.proc = subprocess.Popen(
            worker_command(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr if stderr is not None else subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
            text=True,
            encoding="utf-8",
            bufsize=1,
        )
        self.events: queue.Queue[Event | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        hello = self.next_event(timeout=protocol.HANDSHAKE_TIMEOUT_S)
        if not isinstance(hello, ReadyEvent):
            raise ProtocolError(f"expected a ready event, got {hello}")
        if hello.protocol != protocol.PROTOCOL_VERSION:
            raise ProtocolError(
                f"incompatible worker protocol {hello.protocol}; this app speaks {protocol.PROTOCOL_VERSION}"
            )
        self.hello = hello

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                self.events.put(protocol.decode_event(line))
            except ProtocolError as exc:
                self.events.put(ErrorEvent(None, exc.kind, str(exc)))
        self.events.put(None)

    def new_id(self) -> str:
        return f"r{next(self._ids)}"

    def send(self, message: Any) -> None:
        line = message if isinstance(message, str) else protocol.encode(message)
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
        except UnicodeEncodeError as exc:  # nothing was written: the line is encoded whole first
            raise ProtocolError(f"the request's text is not valid Unicode ({exc.reason} at offset {exc.start}); "
                                "it was not sent") from None
        except (BrokenPipeError, OSError) as exc:
            raise WorkerDied(describe_exit(self.proc.poll())) from exc

    def next_event(self, timeout: float | None = None) -> Event:
        try:
            item = self.events.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"no event from the worker within {timeout} s") from None
        if item is None:
            self.events.put(None)  # keep reporting the death
            raise WorkerDied(describe_exit(self.proc.wait(timeout=5)))
        return item

    def events_until_done(self, request: str, timeout: float | None = 600) -> Iterator[Event]:
        """Yield events of ``request`` up to and including the one that ends it.

        Every request ends with exactly one final event: ``loaded``, ``done``,
        ``unloaded``, ``bye``, or an ``error`` marked ``final``.
        """
        while True:
            ev = self.next_event(timeout)
            if ev.id not in (request, None):
                continue
            yield ev
            if is_final(ev):
                return

    def call(self, message: Any, timeout: float | None = 600) -> list[Event]:
        """Send a request and collect its events until it is finished."""
        self.send(message)
        return list(self.events_until_done(message.id, timeout))

    def close(self, timeout: float = 10) -> int | None:
        if self.proc.poll() is None:
            try:
                self.send(protocol.ShutdownRequest(id=self.new_id()))
                self.proc.wait(timeout=timeout)
            except Exception:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def __enter__(self) -> WorkerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
