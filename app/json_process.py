"""Run a headless engine command (``python -m engine …``) in a child process
and receive its JSON lines as signals: the GUI never blocks and never loads
llama.cpp itself."""

from __future__ import annotations

import json
import sys

from PySide6.QtCore import QObject, QProcess, Signal


class JsonProcess(QObject):
    """Signals:
        sig_message(dict): one JSON object the command printed.
        sig_finished(int, str): exit code, and the tail of stderr when it failed.
    """

    sig_message = Signal(dict)
    sig_finished = Signal(int, str)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.proc: QProcess | None = None
        self._buf = b""
        self._err = b""
        self._all = b""
        self._emitted = 0

    def start(self, args: list[str]) -> None:
        self.stop()
        proc = QProcess(self)
        proc.readyReadStandardOutput.connect(self._on_stdout)
        proc.readyReadStandardError.connect(self._on_stderr)
        proc.finished.connect(self._on_finished)
        self.proc = proc
        self._buf = self._err = self._all = b""
        self._emitted = 0
        proc.start(sys.executable, ["-m", "engine", *args])

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.state() != QProcess.ProcessState.NotRunning

    def stop(self) -> None:
        if self.running:
            assert self.proc is not None
            self.proc.kill()
            self.proc.waitForFinished(2000)

    def _on_stdout(self) -> None:
        assert self.proc is not None
        data = bytes(self.proc.readAllStandardOutput().data())
        self._all += data
        self._buf += data
        *lines, self._buf = self._buf.split(b"\n")
        for line in lines:
            line = line.strip()
            if line.startswith(b"{"):
                try:
                    message = json.loads(line)
                except ValueError:
                    continue
                self._emitted += 1
                self.sig_message.emit(message)

    def _on_stderr(self) -> None:
        assert self.proc is not None
        self._err = (self._err + bytes(self.proc.readAllStandardError().data()))[-4000:]

    def _on_finished(self, code: int, _status: object) -> None:
        self._on_stdout()
        if not self._emitted and self._all.strip().startswith(b"{"):
            try:  # one pretty-printed JSON document rather than JSON lines
                self.sig_message.emit(json.loads(self._all))
            except ValueError:
                pass
        tail = "" if code == 0 else self._err.decode("utf-8", errors="replace").strip().splitlines()[-1:]
        self.sig_finished.emit(code, tail[0] if tail else "")
