"""The GUI's connection to the engine worker: a QProcess speaking the worker
protocol, turned into typed Qt signals.

The worker may die at any moment (a native abort, an out-of-memory kill, a
SIGILL from a wrong engine build); the client notices, says why in words,
and can start a fresh worker. It never blocks the GUI thread.
"""

from __future__ import annotations

import itertools
import sys
from typing import Any

from PySide6.QtCore import QObject, QProcess, QProcessEnvironment, QTimer, Signal

from engine.errors import ProtocolError
from engine.worker import protocol as P
from engine.worker.client import describe_exit


class EngineClient(QObject):
    """Owns one worker process.

    Signals:
        sig_ready(dict): the handshake arrived (protocol version, engine build).
        sig_loaded(str, dict): request id, model facts.
        sig_token(str, str, bool): request id, text delta, came from accepted drafts.
        sig_stats(str, dict): request id, live statistics.
        sig_done(str, dict): request id, the final event (finish_reason, stats).
        sig_error(str, str, str): request id (may be empty), error kind, message.
        sig_died(str): the worker ended unexpectedly; the text says why.
        sig_state(str): "starting" | "ready" | "loading" | "busy" | "dead" | "stopped".
    """

    sig_ready = Signal(dict)
    sig_loaded = Signal(str, dict)
    sig_token = Signal(str, str, bool)
    sig_stats = Signal(str, dict)
    sig_done = Signal(str, dict)
    sig_error = Signal(str, str, str)
    sig_died = Signal(str)
    sig_state = Signal(str)

    HANDSHAKE_TIMEOUT_MS = int(P.HANDSHAKE_TIMEOUT_S * 1000)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._ids = itertools.count(1)
        self._proc: QProcess | None = None
        self._buffer = b""
        self._expect_exit = False
        self.state = "stopped"
        self.engine_info: dict[str, Any] = {}
        self.stderr_tail: list[str] = []
        self._handshake_timer = QTimer(self)
        self._handshake_timer.setSingleShot(True)
        self._handshake_timer.timeout.connect(self._on_handshake_timeout)

    # -- lifecycle ----------------------------------------------------------
    def start(self) -> None:
        if self._proc is not None:
            return
        proc = QProcess(self)
        env = QProcessEnvironment.systemEnvironment()
        proc.setProcessEnvironment(env)
        proc.readyReadStandardOutput.connect(self._on_stdout)
        proc.readyReadStandardError.connect(self._on_stderr)
        proc.finished.connect(self._on_finished)
        proc.errorOccurred.connect(self._on_process_error)
        self._proc = proc
        self._buffer = b""
        self._expect_exit = False
        self.stderr_tail = []
        self._set_state("starting")
        proc.start(sys.executable, ["-m", "engine.worker"])
        self._handshake_timer.start(self.HANDSHAKE_TIMEOUT_MS)

    def restart(self) -> None:
        self.stop(wait_ms=2000)
        self.start()

    def stop(self, wait_ms: int = 3000) -> None:
        proc = self._proc
        if proc is None:
            return
        self._expect_exit = True
        if proc.state() != QProcess.ProcessState.NotRunning:
            self._write(P.ShutdownRequest(id=self._new_id()))
            if not proc.waitForFinished(wait_ms):
                proc.kill()
                proc.waitForFinished(1000)
        self._proc = None
        self._set_state("stopped")

    @property
    def pid(self) -> int | None:
        return int(self._proc.processId()) if self._proc is not None else None

    # -- requests ---------------------------------------------------------
    def load(self, path: str | None, *, n_ctx: int = 4096, n_threads: int = 1, n_gpu_layers: int = 0,
             mtp: bool = True, sidecar: str | None = None) -> str:
        rid = self._new_id()
        self._write(P.LoadRequest(id=rid, path=path, n_ctx=n_ctx, n_threads=n_threads,
                                  n_gpu_layers=n_gpu_layers, mtp=mtp, sidecar=sidecar))
        self._set_state("loading")
        return rid

    def generate(self, *, messages: list[dict[str, str]] | None = None, prompt: str | None = None,
                 **settings: Any) -> str:
        rid = self._new_id()
        self._write(P.GenerateRequestMsg(id=rid, messages=messages, prompt=prompt, **settings))
        self._set_state("busy")
        return rid

    def cancel(self, rid: str | None = None) -> None:
        self._write(P.CancelRequest(id=self._new_id(), target=rid))

    # -- internals ----------------------------------------------------------
    def _new_id(self) -> str:
        return f"q{next(self._ids)}"

    def _write(self, message: Any) -> None:
        if self._proc is None or self._proc.state() != QProcess.ProcessState.Running:
            self.sig_error.emit(getattr(message, "id", ""), "worker_died",
                                "The engine is not running. Restart it from the banner.")
            return
        self._proc.write((P.encode(message) + "\n").encode("utf-8"))

    def _set_state(self, state: str) -> None:
        if state != self.state:
            self.state = state
            self.sig_state.emit(state)

    def _on_stdout(self) -> None:
        assert self._proc is not None
        self._buffer += bytes(self._proc.readAllStandardOutput().data())
        *lines, self._buffer = self._buffer.split(b"\n")
        for line in lines:
            if line.strip():
                self._dispatch(line)

    def _dispatch(self, line: bytes) -> None:
        try:
            ev = P.decode_event(line)
        except ProtocolError as exc:
            self.sig_error.emit("", exc.kind, str(exc))
            return
        kind, rid = ev["type"], ev.get("id") or ""
        if kind == "ready":
            self._handshake_timer.stop()
            if ev.get("protocol") != P.PROTOCOL_VERSION:
                self.sig_error.emit("", "protocol", f"The engine speaks protocol {ev.get('protocol')}; "
                                    f"this app needs {P.PROTOCOL_VERSION}. Reinstall MTP Studio.")
                self.stop()
                return
            self.engine_info = ev.get("engine", {})
            self._set_state("ready")
            self.sig_ready.emit(ev)
        elif kind == "loaded":
            self._set_state("ready")
            self.sig_loaded.emit(rid, ev["model"])
        elif kind == "token":
            self.sig_token.emit(rid, ev["text"], bool(ev.get("draft")))
        elif kind == "stats":
            self.sig_stats.emit(rid, ev["stats"])
        elif kind == "done":
            self._set_state("ready")
            self.sig_done.emit(rid, ev)
        elif kind == "error":
            if ev.get("final", True) and self.state == "loading":
                self._set_state("ready")
            self.sig_error.emit(rid, ev.get("kind", "engine"), ev.get("message", ""))

    def _on_stderr(self) -> None:
        assert self._proc is not None
        text = bytes(self._proc.readAllStandardError().data()).decode("utf-8", errors="replace")
        self.stderr_tail = (self.stderr_tail + text.splitlines())[-50:]

    def _on_finished(self, code: int, status: QProcess.ExitStatus) -> None:
        self._handshake_timer.stop()
        if self._expect_exit:
            return
        # QProcess reports a crash as CrashExit with the signal number in code.
        exit_code = -code if status == QProcess.ExitStatus.CrashExit else code
        reason = describe_exit(exit_code)
        hints = [line for line in self.stderr_tail if "error" in line.lower() or "assert" in line.lower()]
        if hints:
            reason += f". Last message: {hints[-1].strip()}"
        self._proc = None
        self._set_state("dead")
        self.sig_died.emit(reason[0].upper() + reason[1:])

    def _on_process_error(self, error: QProcess.ProcessError) -> None:
        if error == QProcess.ProcessError.FailedToStart:
            self._proc = None
            self._set_state("dead")
            self.sig_died.emit(f"The engine could not start ({sys.executable} -m engine.worker).")

    def _on_handshake_timeout(self) -> None:
        if self.state == "starting":
            self.stop(wait_ms=500)
            self._set_state("dead")
            self.sig_died.emit(
                f"The engine did not answer within {P.HANDSHAKE_TIMEOUT_S:.0f} s of starting. "
                "Restart it; if this repeats, rebuild the engine (packaging/build_engine.py)."
            )
