"""The autotune wizard: hardware → model → run (progress and a live chart of
speed by setting) → results → apply.

The measuring runs in a child process (``python -m engine autotune --jsonl``);
the wizard only draws what it reports. It times with the chat's sampling
(``--sampling``): a speedup measured greedily does not hold at temperature
0.6 with penalties, and the chat shows the figure only for the sampling it
was measured with.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from typing import Any

from PySide6.QtWidgets import (
    QLabel,
    QProgressBar,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
    QWizard,
    QWizardPage,
)

from app.autotune_chart import SpeedChart
from app.autotune_setup import HardwarePage, ModelPage
from app.hardware_probe import HardwareProbe
from app.json_process import JsonProcess
from app.process import ProcessOutcome
from app.settings import Settings
from app.theme import Palette
from engine.autotune import messages
from engine.errors import ProtocolError
from engine.sampling import GREEDY_KEY, PRESETS, SamplingParams, sampling_key, sampling_label
from engine.speculative.settings import SpeculativeSettings

# How the output of a setting compared with no speculation (engine/generation/identity.py).
_IDENTITY_TEXT = {"identical": "yes", "near_tie": "yes (near tie)", "defect": "NO — differs"}


class RunPage(QWizardPage):
    def __init__(self, palette: Palette) -> None:
        super().__init__()
        self.setTitle("Measuring")
        self.setSubTitle("Each setting generates on the prompt suite; clearly slower settings stop early.")
        self.progress = QProgressBar()
        self.status = QLabel("Starting…")
        self.chart = SpeedChart(palette)
        layout = QVBoxLayout(self)
        layout.addWidget(self.progress)
        layout.addWidget(self.status)
        layout.addWidget(self.chart, 1)
        self.result: messages.ResultMessage | None = None
        self.thread_notes: list[str] = []  # what the thread timing chose, in words
        self.error = ""
        self._started = 0.0  # when the first measurement began (monotonic): the time left is estimated from it
        self._first_step = 0
        self.proc = JsonProcess("autotune", self)
        self.proc.sig_message.connect(self._on_message)
        self.proc.sig_finished.connect(self._on_finished)

    def initializePage(self) -> None:
        wizard = self.wizard()
        assert isinstance(wizard, AutotuneWizard)
        page = wizard.model_page
        args = ["autotune", page.path.text().strip(), "--jsonl", "--prompts", str(page.prompts.value()),
                "--tokens", str(page.tokens.value()), "--threads", str(wizard.settings.n_threads),
                "--sampling", sampling_argument(wizard.sampling)]
        self.setSubTitle(f"Each setting generates on the prompt suite with {wizard.sampling_text}; clearly slower "
                         "settings stop early.")
        if page.sidecar.text().strip():
            args += ["--sidecar", page.sidecar.text().strip()]
        if wizard.n_max:
            args += ["--n-max", str(wizard.n_max)]
        self.result = None
        self.thread_notes = []
        self._started = 0.0
        self.chart.ratios.clear()
        self.progress.setRange(0, 0)
        self.proc.start(args)

    def cleanupPage(self) -> None:
        self.proc.stop()

    def isComplete(self) -> bool:
        return self.result is not None

    def _on_message(self, data: dict[str, Any]) -> None:
        try:
            msg = messages.decode(data)
        except ProtocolError as exc:
            self.status.setText(f"Autotune printed something unexpected: {exc}")
            return
        if isinstance(msg, messages.ProgressMessage):
            self.progress.setRange(0, msg.total)
            self.progress.setValue(msg.step)
            acc = msg.acceptance
            self.status.setText(f"{msg.setting}: {msg.tps:.1f} tok/s"
                                + (f", acceptance {100 * acc:.0f}%" if acc is not None else "")
                                + self._time_left(msg.step, msg.total))
            self.chart.set_ratio(msg.setting, msg.ratio)
        elif isinstance(msg, messages.ThreadsMessage):
            self.thread_notes.append(msg.reason)
            self.status.setText(msg.reason)
        elif isinstance(msg, messages.ResultMessage):
            self.result = msg
            for row in msg.rows:
                self.chart.set_ratio(row.setting, row.ratio)
            self.progress.setRange(0, 1)
            self.progress.setValue(1)
            self.status.setText(f"Done: {msg.label}.")
            self.completeChanged.emit()

    def _time_left(self, step: int, total: int) -> str:
        """`` · about 3 min left``: the steps so far at the pace so far (the first step only starts the clock;
        settings stopped early make the real time shorter, never longer)."""
        now = time.monotonic()
        if not self._started:
            self._started, self._first_step = now, step
            return ""
        done = step - self._first_step
        if done <= 0 or step >= total:
            return ""
        left = (now - self._started) / done * (total - step)
        if left >= 90:
            return f" · about {round(left / 60)} min left"
        return f" · about {max(5, round(left, -1)):.0f} s left"

    def _on_finished(self, outcome: ProcessOutcome) -> None:
        if not outcome.ok and self.result is None:
            self.error = outcome.last_line or str(outcome)
            self.progress.setRange(0, 1)
            self.status.setText(f"Tuning failed: {self.error}")


class ResultsPage(QWizardPage):
    def __init__(self) -> None:
        super().__init__()
        self.setTitle("Results")
        self.decision = QLabel()
        self.decision.setWordWrap(True)
        # "vs off" is paired prompt by prompt: a setting stopped early was timed on fewer (maybe easier) prompts,
        # so its tok/s is set beside what off did on those same prompts, not off's overall figure
        self.table = QTableWidget(0, 7)
        self.table.setHorizontalHeaderLabels(["Setting", "tok/s", "off, same prompts", "vs off", "Acceptance",
                                              "Prompts", "Same output"])
        self.table.horizontalHeaderItem(2).setToolTip("What plain decoding did on the prompts this setting was "
                                                      "timed on: a setting stopped early saw fewer prompts")
        self.table.horizontalHeaderItem(3).setToolTip("This setting's speed over plain decoding's, prompt by prompt")
        self.table.horizontalHeader().setStretchLastSection(True)
        layout = QVBoxLayout(self)
        layout.addWidget(self.decision)
        layout.addWidget(self.table, 1)
        self.setButtonText(QWizard.WizardButton.FinishButton, "Apply")

    def initializePage(self) -> None:
        wizard = self.wizard()
        assert isinstance(wizard, AutotuneWizard)
        result = wizard.run_page.result
        label, reason = (result.label, result.reason) if result else ("off", "")
        notes = [*wizard.run_page.thread_notes, *([result.draft_vocab_reason] if result and result.draft_vocab_reason
                                                   else [])]
        threads = "".join(f"<br>{note[:1].upper() + note[1:]}" for note in notes)
        self.decision.setText(f"<b>Use: {label}</b><br>{reason}{threads}<br>Timed with {wizard.sampling_text}.<br>"
                              "Apply makes it the default for this model on this machine.")
        rows = sorted(result.rows if result else [], key=lambda r: -r.ratio)
        self.table.setRowCount(len(rows))
        for i, r in enumerate(rows):
            acc = f"{100 * r.acceptance:.0f}%" if r.acceptance is not None else "–"
            off = f"≈{r.tps / r.ratio:.1f}" if r.ratio > 0 else "–"  # the ratio is a mean of per-prompt ratios
            values = [r.setting + (" (stopped early)" if r.dropped else ""), f"{r.tps:.1f}", off,
                      f"{r.ratio:.2f}x", acc, str(r.prompts), _IDENTITY_TEXT[r.identity]]
            for j, v in enumerate(values):
                self.table.setItem(i, j, QTableWidgetItem(v))
        self.table.resizeColumnsToContents()


def sampling_argument(sampling: SamplingParams) -> str:
    """``--sampling``: a preset's name, or the values as JSON (the seed left to autotune)."""
    key = sampling_key(sampling)
    if key == GREEDY_KEY or key in PRESETS:
        return key
    return json.dumps({k: v for k, v in asdict(sampling).items() if k != "seed"})


class AutotuneWizard(QWizard):
    """Args:
        n_max: the deepest draft to try (default: whatever the model drafts).
        sampling: what to time with: the chat's (default: the preferences' sampling).
    """

    def __init__(self, settings: Settings, palette: Palette, probe: HardwareProbe, parent: QWidget | None = None,
                 n_max: int | None = None, sampling: SamplingParams | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Autotune speculative decoding")
        self.settings = settings
        self.n_max = n_max
        self.sampling = sampling or settings.sampling
        key = sampling_key(self.sampling)
        self.sampling_text = f"the chat's sampling ({sampling_label(key)}" + (
            ", seeded; the same output is checked greedily)" if key != GREEDY_KEY else ")")
        self.hardware_page = HardwarePage(probe)
        self.model_page = ModelPage(settings)
        self.run_page = RunPage(palette)
        self.results_page = ResultsPage()
        for page in (self.hardware_page, self.model_page, self.run_page, self.results_page):
            self.addPage(page)
        self.resize(760, 560)

    def applied_setting(self) -> SpeculativeSettings | None:
        result = self.run_page.result
        return result.best if result else None

    def accept(self) -> None:
        best = self.applied_setting()
        if best is not None:
            self.settings.model_path = self.model_page.path.text().strip() or None
            self.settings.sidecar_path = self.model_page.sidecar.text().strip() or None
            self.settings.speculative = "auto"
            result = self.run_page.result
            if result is not None and result.threads:  # measured here: the next load uses them
                self.settings.n_threads = result.threads
                self.settings.n_threads_draft = result.threads_draft
            if result is not None and result.draft_vocab is not None:  # measured here: this model's next load
                self.settings.set_draft_vocab(self.settings.model_path, result.draft_vocab)
            self.settings.try_save()  # on a full disk: kept in memory, saved at quit
        super().accept()

    def reject(self) -> None:
        self.run_page.proc.stop()
        super().reject()
