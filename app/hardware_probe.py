"""The hardware probe, run once in a child process and shared: the status
bar's profile lookup, the Hardware page and the autotune wizard all read the
same report (``mtp-studio hardware --json``), decoded once into a typed
``HardwareReport``."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QObject, Signal

from app.json_process import JsonProcess
from app.process import ProcessOutcome
from engine.hardware.probe import HardwareReport
from engine.hardware.recommend import Recommendation, recommend


class HardwareProbe(QObject):
    """Signals:
        sig_report(HardwareReport): a report arrived (the first, or after :meth:`refresh`).
        sig_failed(str): the probe ended without a report; the text says how.
    """

    sig_report = Signal(object)
    sig_failed = Signal(str)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.report: HardwareReport | None = None
        self._proc = JsonProcess("the hardware probe", self)
        self._proc.sig_message.connect(self._on_report)
        self._proc.sig_finished.connect(self._on_finished)

    @property
    def fingerprint(self) -> str | None:
        return self.report.fingerprint() if self.report else None

    @property
    def recommendation(self) -> Recommendation | None:
        """Which engine build fits, worked out from the report as ``mtp-studio hardware`` does."""
        return recommend(self.report) if self.report else None

    @property
    def running(self) -> bool:
        return self._proc.running

    def ensure(self) -> None:
        """Probe unless a report is here or on its way."""
        if self.report is None and not self.running:
            self.refresh()

    def refresh(self) -> None:
        """Probe again (the user asked: "Check again", or a new engine build)."""
        self._proc.start(["hardware", "--json"])

    def stop(self) -> None:
        self._proc.stop()

    def _on_report(self, data: dict[str, Any]) -> None:
        try:
            report = HardwareReport.from_json(data)
        except (TypeError, ValueError, AttributeError) as exc:  # a report of another shape: said, not raised
            self.sig_failed.emit(f"the hardware probe printed a report this app cannot read ({exc})")
            return
        self.report = report
        self.sig_report.emit(report)

    def _on_finished(self, outcome: ProcessOutcome) -> None:
        if not outcome.ok:
            detail = f": {outcome.last_line}" if outcome.last_line else ""
            self.sig_failed.emit(f"{outcome}{detail}")
