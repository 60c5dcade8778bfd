"""Every child process the app starts goes through :class:`ChildProcess`: the
engine worker, the JSON tools (hardware probe, autotune), the engine build.

One wrapper means one behaviour on a crash: however a child ends, its owner
gets a :class:`ProcessOutcome` that says how, in words a user can read
(after qutebrowser's ``GUIProcess`` and ``ProcessOutcome``).
"""

from __future__ import annotations

import signal
import sys
from dataclasses import dataclass

from PySide6.QtCore import QObject, QProcess, Signal

from engine.worker.client import describe_exit

STDERR_TAIL_LINES = 50


@dataclass(frozen=True)
class ProcessOutcome:
    """How a child process ended.

    Attributes:
        what: the process in words ("the engine process", "the hardware probe").
        started: False when it never ran (the program is missing or not executable).
        code: the exit code, or the signal number when ``crashed``.
        crashed: it was ended by a signal (a native abort, a kill).
        expected: the app asked it to stop.
        stderr_tail: the last lines it wrote to stderr.
    """

    what: str
    started: bool = True
    code: int | None = None
    crashed: bool = False
    expected: bool = False
    stderr_tail: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.started and not self.crashed and self.code == 0

    @property
    def signal_name(self) -> str | None:
        """``SIGKILL`` and the like when a signal ended it."""
        if not self.crashed or self.code is None:
            return None
        try:
            return signal.Signals(self.code).name
        except ValueError:
            return f"signal {self.code}"

    @property
    def exit_status(self) -> int | None:
        """POSIX style: the exit code, or minus the signal number."""
        if self.code is None:
            return None
        return -self.code if self.crashed else self.code

    @property
    def last_error(self) -> str:
        """The last stderr line that names an error or a failed assertion, if any."""
        hints = [ln for ln in self.stderr_tail if "error" in ln.lower() or "assert" in ln.lower()]
        return hints[-1].strip() if hints else ""

    @property
    def last_line(self) -> str:
        """The last line it wrote to stderr (a Python tool's exception)."""
        lines = [ln for ln in self.stderr_tail if ln.strip()]
        return lines[-1].strip() if lines else ""

    def __str__(self) -> str:
        if not self.started:
            return f"{self.what} could not start ({sys.executable})"
        return describe_exit(self.exit_status, self.what)


class ChildProcess(QObject):
    """A QProcess with line-wise stdout, a stderr tail and a :class:`ProcessOutcome`.

    Signals:
        sig_lines(list): complete stdout lines (bytes, without the newline),
            as they arrive; with ``merge_stderr`` stderr's lines too.
        sig_finished(ProcessOutcome): it ended, or it could not start.
    """

    sig_lines = Signal(list)
    sig_finished = Signal(object)

    def __init__(self, what: str, parent: QObject | None = None, *, merge_stderr: bool = False) -> None:
        super().__init__(parent)
        self.what = what
        self.merge_stderr = merge_stderr
        self._proc: QProcess | None = None
        self._buffer = b""
        self._expected = False
        self.stderr_tail: list[str] = []

    # -- lifecycle ----------------------------------------------------------
    def start(self, args: list[str], program: str = sys.executable) -> None:
        """Start ``program args`` (by default this Python); a running one is stopped first."""
        self.kill()
        proc = QProcess(self)
        if self.merge_stderr:
            proc.setProcessChannelMode(QProcess.ProcessChannelMode.MergedChannels)
        else:
            proc.readyReadStandardError.connect(self._on_stderr)
        proc.readyReadStandardOutput.connect(self._on_stdout)
        proc.finished.connect(self._on_finished)
        proc.errorOccurred.connect(self._on_error)
        self._proc = proc
        self._buffer = b""
        self._expected = False
        self.stderr_tail = []
        proc.start(program, args)

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.state() != QProcess.ProcessState.NotRunning

    @property
    def pid(self) -> int | None:
        return int(self._proc.processId()) if self.running and self._proc is not None else None

    def write(self, data: bytes) -> bool:
        """Send bytes to its stdin; False when it is not running."""
        if self._proc is None or self._proc.state() != QProcess.ProcessState.Running:
            return False
        self._proc.write(data)
        return True

    def stop(self, wait_ms: int = 2000, farewell: bytes | None = None) -> None:
        """End it on purpose (its outcome says ``expected``): send ``farewell``
        and wait up to ``wait_ms`` for it to exit, then kill it."""
        proc = self._proc
        if proc is None or proc.state() == QProcess.ProcessState.NotRunning:
            return
        self._expected = True
        if farewell is not None and self.write(farewell) and proc.waitForFinished(wait_ms):
            return
        proc.kill()
        proc.waitForFinished(wait_ms)

    def kill(self) -> None:
        """Stop at once (a tool the user abandoned)."""
        self.stop(wait_ms=2000)

    # -- QProcess -------------------------------------------------------------
    def _on_stdout(self) -> None:
        if self._proc is None:
            return
        self._buffer += bytes(self._proc.readAllStandardOutput().data())
        if b"\n" not in self._buffer:
            return
        *lines, self._buffer = self._buffer.split(b"\n")
        self.sig_lines.emit(lines)

    def _on_stderr(self) -> None:
        if self._proc is None:
            return
        text = bytes(self._proc.readAllStandardError().data()).decode("utf-8", errors="replace")
        self.stderr_tail = (self.stderr_tail + text.splitlines())[-STDERR_TAIL_LINES:]

    def _on_finished(self, code: int, status: QProcess.ExitStatus) -> None:
        if self.sender() is not self._proc:
            return  # a process replaced by a newer start
        self._on_stdout()
        if not self.merge_stderr:
            self._on_stderr()
        if self._buffer.strip():
            self.sig_lines.emit([self._buffer])
        self._buffer = b""
        # QProcess reports a crash as CrashExit with the signal number as the code.
        self._report(ProcessOutcome(self.what, True, int(code), status == QProcess.ExitStatus.CrashExit,
                                    self._expected, tuple(self.stderr_tail)))

    def _on_error(self, error: QProcess.ProcessError) -> None:
        if error == QProcess.ProcessError.FailedToStart and self.sender() is self._proc:
            self._report(ProcessOutcome(self.what, started=False, expected=self._expected))

    def _report(self, outcome: ProcessOutcome) -> None:
        if self._proc is not None:
            self._proc.deleteLater()
        self._proc = None
        self.sig_finished.emit(outcome)
