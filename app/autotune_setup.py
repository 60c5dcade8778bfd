"""The autotune wizard's first pages: this machine (the hardware probe's report and what it
recommends) and the model to tune (target and sidecar, checked from their headers)."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtWidgets import (
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWizardPage,
)

import engine.gguf.facts
from app import background
from app.hardware_probe import HardwareProbe
from app.settings import Settings
from engine.errors import ModelFileError
from engine.gguf.facts import GGUFFacts
from engine.hardware.probe import HardwareReport
from engine.hardware.recommend import recommend


def _read_pair(path: str, sidecar: str) -> tuple[GGUFFacts, GGUFFacts | None] | str:
    """The target's and sidecar's header facts, or why they cannot be read."""
    try:
        return engine.gguf.facts.read_facts(path), engine.gguf.facts.read_facts(sidecar) if sidecar else None
    except ModelFileError as exc:
        return str(exc)


class HardwarePage(QWizardPage):
    """Shows the shared hardware probe's report (probing once if nobody has yet)."""

    def __init__(self, probe: HardwareProbe) -> None:
        super().__init__()
        self.setTitle("This machine")
        self.setSubTitle("Tuning is specific to the hardware and the engine build; it is remembered for both.")
        self.text = QLabel("Looking at the hardware…")
        self.text.setWordWrap(True)
        QVBoxLayout(self).addWidget(self.text)
        self.report: HardwareReport | None = None
        self.probe = probe
        probe.sig_report.connect(self._on_report)
        probe.sig_failed.connect(self._on_failed)

    def initializePage(self) -> None:
        if self.probe.report is not None:
            self._on_report(self.probe.report)
        else:
            self.probe.ensure()

    def isComplete(self) -> bool:
        return self.report is not None

    def _on_report(self, report: HardwareReport) -> None:
        self.report = r = report
        gpus = ", ".join(g.name for g in r.gpus) or "none"
        ram = f"{r.ram_mib / 1024:.1f} GiB" if r.ram_mib else "unknown"
        self.text.setText(
            f"<b>{r.cpu_model}</b>, {r.cores} cores, {ram} RAM<br>"
            f"GPUs: {gpus}<br>Engine: llama-cpp-python {r.engine_version} "
            f"({r.backend})<br>Fingerprint: <code>{r.fingerprint()}</code><br><br>"
            + " ".join(recommend(r).reasons)
        )
        self.completeChanged.emit()

    def _on_failed(self, message: str) -> None:
        if self.report is None:
            self.text.setText(f"The hardware probe failed: {message}")


class ModelPage(QWizardPage):
    def __init__(self, settings: Settings) -> None:
        super().__init__()
        self.setTitle("Model")
        self.setSubTitle("Choose the GGUF to tune. It needs an MTP head (in the file or as a sidecar).")
        self.path = QLineEdit(settings.model_path or "")
        self.sidecar = QLineEdit(settings.sidecar_path or "")
        browse = QPushButton("Browse…")
        browse.clicked.connect(lambda: self._browse(self.path))
        browse_side = QPushButton("Browse…")
        browse_side.clicked.connect(lambda: self._browse(self.sidecar))
        self.facts = QLabel()
        self.facts.setWordWrap(True)
        self.prompts = QSpinBox(minimum=2, maximum=9, value=9)
        self.tokens = QSpinBox(minimum=16, maximum=512, value=96)
        form = QFormLayout(self)
        row = QHBoxLayout()
        row.addWidget(self.path)
        row.addWidget(browse)
        form.addRow("Model", row)
        row2 = QHBoxLayout()
        row2.addWidget(self.sidecar)
        row2.addWidget(browse_side)
        form.addRow("MTP sidecar (optional)", row2)
        form.addRow("Prompts", self.prompts)
        form.addRow("Tokens per prompt", self.tokens)
        form.addRow(self.facts)
        self.path.textChanged.connect(self._check)
        self.sidecar.textChanged.connect(self._check)
        self._ok = False
        self._checks = 0  # a header read that a newer one overtook is dropped
        self._task: background.Task | None = None

    def initializePage(self) -> None:
        self._check()

    def _browse(self, target: QLineEdit) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Choose a GGUF", str(Path.home()), "GGUF (*.gguf)")
        if path:
            target.setText(path)

    def _check(self) -> None:
        """Read the headers on the background runner (a model on a slow disk must not freeze the wizard)."""
        self._ok = False
        self.completeChanged.emit()
        self._checks += 1
        check = self._checks
        self._task = background.run(_read_pair, self.path.text().strip(), self.sidecar.text().strip())
        self._task.sig_done.connect(lambda result: self._show(result, check))

    def _show(self, result: tuple[GGUFFacts, GGUFFacts | None] | str, check: int) -> None:
        if check != self._checks:
            return
        if isinstance(result, str):
            self.facts.setText(result if self.path.text().strip() else "Choose a model file.")
        else:
            facts, side = result
            heads = side.nextn_layers if side else facts.nextn_layers
            self.facts.setText(f"{facts.architecture}, {facts.trunk_layers} layers, {heads} MTP head(s), "
                               f"{facts.file_size / 2**20:.0f} MiB."
                               + ("" if heads else " It has no MTP head: the result will be 'off'."))
            self._ok = True
        self.completeChanged.emit()

    def isComplete(self) -> bool:
        return self._ok
