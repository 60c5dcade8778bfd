"""Run a headless engine command (``python -m engine …``) in a child process
and receive its JSON lines as signals: the GUI never blocks and never loads
llama.cpp itself."""

from __future__ import annotations

import json
from typing import Any

from PySide6.QtCore import QObject, Signal

from app.process import ChildProcess, ProcessOutcome


class JsonProcess(QObject):
    """Signals:
        sig_message(dict): one JSON object the command printed.
        sig_finished(ProcessOutcome): it ended; an outcome the app asked for
            (a newer start, :meth:`stop`) is not reported.
    """

    sig_message = Signal(dict)
    sig_finished = Signal(object)

    def __init__(self, what: str, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._proc = ChildProcess(what, self)
        self._proc.sig_lines.connect(self._on_lines)
        self._proc.sig_finished.connect(self._on_finished)
        self._lines: list[bytes] = []
        self._emitted = 0

    def start(self, args: list[str]) -> None:
        self._proc.stop()
        self._lines = []
        self._emitted = 0
        self._proc.start(["-m", "engine", *args])

    @property
    def running(self) -> bool:
        return self._proc.running

    def stop(self) -> None:
        self._proc.stop()

    def _on_lines(self, lines: list[bytes]) -> None:
        self._lines += lines
        for line in lines:
            line = line.strip()
            if line.startswith(b"{"):
                try:
                    message = json.loads(line)
                except ValueError:
                    continue  # part of a pretty-printed document: read whole at the end
                if isinstance(message, dict):
                    self._emitted += 1
                    self.sig_message.emit(message)

    def _on_finished(self, outcome: ProcessOutcome) -> None:
        if outcome.expected:
            return
        whole = b"\n".join(self._lines).strip()
        if not self._emitted and whole.startswith(b"{"):
            try:  # one pretty-printed JSON document rather than JSON lines
                document: Any = json.loads(whole)
            except ValueError:
                document = None
            if isinstance(document, dict):
                self.sig_message.emit(document)
        self.sig_finished.emit(outcome)
