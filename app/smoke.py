"""``mtp-studio --smoke-test``: the app checks itself the way a user would.

Made for the packaged app (``packaging/smoke_frozen.py`` runs it on the built
artifact), where no test suite and no Python are at hand. It drives the real
window: waits for the default model to load in the worker, sends a prompt
through the composer and waits for the streamed reply, kills the worker and
recovers through the banner's button, streams a second reply, and quits.

Each step prints one JSON line on stdout (``{"smoke": step, ...}``) with its
time since the process started; the last is ``passed`` or ``failed``, and the
exit status says the same. The user's settings are restored before quitting,
but the two test chats are stored like any other: run it with a fresh data
folder (the script does).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from dataclasses import replace
from typing import Any

from PySide6.QtCore import QObject, QTimer, Signal

PROMPTS = ("The capital of France is", "Once upon a time")
MAX_TOKENS = 16
TIMEOUT_S = 300


def process_started_at() -> float:
    """Wall-clock time this process was created (the steps' ``since_start_s`` count from it).

    On Linux from the kernel's own clocks (10 ms ticks): psutil's create_time
    adds the boot time, which /proc gives in whole seconds.
    """
    try:
        start_ticks = int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[19])
        uptime = float(open("/proc/uptime").read().split()[0])
        return time.time() - (uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil

        return float(psutil.Process().create_time())
    except Exception:  # the OS would not say: count from now
        return time.time()


class SmokeTest(QObject):
    """Runs the steps on the live :class:`app.application.Services`.

    Signals:
        sig_finished(int): the outcome as an exit status (0 passed); ``run`` connects it to
            ``QApplication.exit``. Tests do not: exiting would end every later event loop.
    """

    sig_finished = Signal(int)

    def __init__(self, services: Any, started_at: float | None = None) -> None:
        super().__init__()
        self.services, self.window, self.client = services, services.window, services.client
        self.started_at = started_at if started_at is not None else process_started_at()
        self.step = "start"
        self.sent_at = 0.0
        self.first_token_s: float | None = None
        self.replies = 0
        self.restore = {k: getattr(services.settings, k) for k in ("max_tokens", "sampling")}
        self.exit_code: int | None = None
        self._timeout = QTimer(self)
        self._timeout.setSingleShot(True)
        self._timeout.timeout.connect(lambda: self.fail(f"timed out after {TIMEOUT_S} s at step {self.step!r}"))

    def begin(self) -> None:
        """Call once the window is shown; everything after is driven by signals."""
        self.report("window_shown")
        self._timeout.start(TIMEOUT_S * 1000)
        self.client.sig_loaded.connect(self._on_loaded)
        self.client.sig_token.connect(self._on_token)
        self.client.sig_died.connect(self._on_died)
        self.window.chat.sig_reply_finished.connect(self._on_finished)
        self.step = "loading"  # Services.start() asked for the default model; it loads in the worker

    # -- steps --------------------------------------------------------------------
    def _on_loaded(self, event: Any) -> None:
        if self.step == "loading":
            self.report("model_loaded", model=str(getattr(getattr(event, "model", None), "path", "")))
            self._send(PROMPTS[0])
        elif self.step == "recovering":
            self.report("recovered")
            self._send(PROMPTS[1])

    def _send(self, text: str) -> None:
        settings = self.services.settings
        settings.max_tokens = MAX_TOKENS
        settings.sampling = replace(settings.sampling, temperature=0.0, repeat_penalty=1.0)
        self.step, self.first_token_s = "streaming", None
        self.window.composer.setPlainText(text)
        self.sent_at = time.time()
        self.window.send_button.click()

    def _on_token(self, _event: object) -> None:
        if self.step == "streaming" and self.first_token_s is None:
            self.first_token_s = time.time() - self.sent_at
            self.report("first_token", since_send_s=round(self.first_token_s, 3))

    def _on_finished(self, how: str) -> None:
        if self.step != "streaming":
            return
        if how != "complete":
            self.fail(f"reply {self.replies + 1} ended {how!r}")
            return
        self.replies += 1
        self.report("reply_complete", reply=self.replies, seconds=round(time.time() - self.sent_at, 3))
        if self.replies == 1:
            self.step = "killing"
            pid = self.client.pid
            os.kill(pid, signal.SIGKILL if hasattr(signal, "SIGKILL") else signal.SIGTERM)
        else:
            self.finish()

    def _on_died(self, why: str) -> None:
        if self.step != "killing":
            self.fail(f"the worker died unexpectedly: {why}")
            return
        self.report("worker_killed", banner=self.window.banner.label.text()[:120])
        self.step = "recovering"
        self.window.banner.button.click()  # what a user clicks: restart the engine and reload

    # -- outcome ------------------------------------------------------------------
    def finish(self) -> None:
        text = self.window.transcript.toPlainText()
        missing = [p for p in PROMPTS if p not in text]
        if missing:
            self.fail(f"the transcript lacks {missing}")
            return
        self.report("passed")
        self._quit(0)

    def fail(self, why: str) -> None:
        self.report("failed", why=why)
        self._quit(1)

    def _quit(self, code: int) -> None:
        if self.exit_code is not None:
            return
        self.exit_code = code
        self._timeout.stop()
        for key, value in self.restore.items():
            setattr(self.services.settings, key, value)
        self.sig_finished.emit(code)

    def report(self, step: str, **fields: object) -> None:
        line = {"smoke": step, "since_start_s": round(time.time() - self.started_at, 3), **fields}
        print(json.dumps(line), flush=True)
        sys.stdout.flush()
