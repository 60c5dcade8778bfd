"""The hardware page: this machine, its devices, the active engine build, and
the action that builds the engine matching the hardware (with the compiler's
log). A failed build leaves the working engine in place."""

from __future__ import annotations

import html
import re
from pathlib import Path

from PySide6.QtWidgets import (
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.hardware_probe import HardwareProbe
from app.process import ChildProcess, ProcessOutcome
from app.remote_devices import RemoteDevicesBox
from engine import frozen
from engine.build_record import engine_patches
from engine.hardware.probe import HardwareReport, LoadedBackend
from engine.hardware.recommend import recommend

BUILD_SCRIPT = Path(__file__).resolve().parents[1] / "packaging" / "build_engine.py"
_STEP = re.compile(r"\[(\d+)/(\d+)\]")


def _saved_rpc_servers() -> str:
    from app.settings import Settings

    return Settings.load().rpc_servers


PACKAGED_ENGINE_NOTE = ("This installed app carries its engine: ggml picks the best CPU kernels and any GPU backend "
                        "it ships at start; building another engine needs a source checkout (README).")


def loaded_backends_text(backends: list[LoadedBackend]) -> str:
    """"Loaded backends: CPU (libggml-cpu-haswell.so)": which CPU variant / GPU library ggml chose."""
    if not backends:
        return ""
    parts = [f"{b.name} ({b.library})" if b.library else b.name for b in backends]
    return f"Loaded backends: {html.escape(', '.join(parts))}<br>"


def gpu_offload_text(report: HardwareReport) -> str:
    """"GPU offload yes" only where the engine has a GPU device.

    ``llama_supports_gpu_offload()`` is also true on a CPU-only build that
    carries the RPC backend (layers can go to remote machines), so the flag
    alone said "yes" on machines with no GPU at all.
    """
    if report.gpu_offload and report.gpu_devices:
        return "GPU offload yes"
    if report.gpu_offload:
        return "GPU offload no (no GPU in this build; layers can go to remote devices over RPC)"
    return "GPU offload no"


class HardwarePage(QWidget):
    """Shows the shared hardware probe's report; builds the engine in a child process."""

    def __init__(self, probe: HardwareProbe, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.summary = QLabel("Looking at the hardware…")
        self.summary.setWordWrap(True)
        self.devices = QTableWidget(0, 4)
        self.devices.setHorizontalHeaderLabels(["Device", "Description", "Type", "Memory"])
        header = self.devices.horizontalHeader()  # the description takes the room, the rest their text's width:
        for column, mode in enumerate((QHeaderView.ResizeMode.ResizeToContents, QHeaderView.ResizeMode.Stretch,
                                       QHeaderView.ResizeMode.ResizeToContents,
                                       QHeaderView.ResizeMode.ResizeToContents)):
            header.setSectionResizeMode(column, mode)  # a stretched Memory column cut "Intel(R) Xeon(R) …"
        self.devices.verticalHeader().hide()
        self.recommendation = QLabel()
        self.recommendation.setWordWrap(True)
        self.build_button = QPushButton("Build the matching engine")
        self.build_button.setEnabled(False)
        self.refresh_button = QPushButton("Check again")
        self.progress = QProgressBar()
        self.progress.hide()
        self.log = QPlainTextEdit()
        self.log.setReadOnly(True)
        self.log.setPlaceholderText("The compiler's log appears here during a build.")
        row = QHBoxLayout()
        row.addWidget(self.refresh_button)
        row.addWidget(self.build_button)
        row.addStretch(1)
        col = QVBoxLayout(self)
        col.addWidget(self.summary)
        col.addWidget(self.devices)
        col.addWidget(self.recommendation)
        col.addLayout(row)
        self.remote = RemoteDevicesBox(_saved_rpc_servers())
        col.addWidget(self.remote)
        col.addWidget(self.progress)
        col.addWidget(self.log, 1)
        self.report: HardwareReport | None = None
        self.probe = probe
        probe.sig_report.connect(self._show)
        probe.sig_failed.connect(lambda message: self.summary.setText(f"The hardware probe failed: {message}"))
        self.refresh_button.clicked.connect(self.refresh)
        self.build_button.clicked.connect(self.build)
        self.build_proc = ChildProcess("the engine build", self, merge_stderr=True)
        self.build_proc.sig_lines.connect(self._on_output)
        self.build_proc.sig_finished.connect(self._on_built)

    def show_report(self) -> None:
        """Show the shared report, probing first if there is none yet."""
        if self.probe.report is not None:
            self._show(self.probe.report)
        else:
            self.probe.ensure()

    def refresh(self) -> None:
        self.summary.setText("Looking at the hardware…")
        self.probe.refresh()
        self.remote.probe()

    def _show(self, report: HardwareReport) -> None:
        self.report = r = report
        ram = f"{r.ram_mib / 1024:.1f} GiB" if r.ram_mib else "unknown"
        gpus = ", ".join(f"{g.name} ({g.api}{', software renderer' if g.software else ''})" for g in r.gpus)
        self.summary.setText(
            f"<b>{r.os}</b>, {r.machine} — {r.cpu_model}, {r.cores} cores, "
            f"{ram} RAM<br>CPU features: {' '.join(r.cpu_flags) or '–'}<br>GPUs: {gpus or 'none found'}<br>"
            f"Active engine: llama-cpp-python {r.engine_version}, backend <b>{r.backend}</b>, "
            f"{gpu_offload_text(r)}<br>"
            f"Engine patches: {html.escape(engine_patches(r.engine))}<br>"
            + loaded_backends_text(r.loaded_backends)
            + f"Fingerprint: {r.fingerprint()}"
            + "".join(f"<br><i>{n}</i>" for n in r.notes)
        )
        self.devices.setRowCount(len(r.engine_devices))
        for i, d in enumerate(r.engine_devices):
            for j, v in enumerate([d.name, d.description, d.type, f"{d.free_mib} / {d.total_mib} MiB free"]):
                self.devices.setItem(i, j, QTableWidgetItem(v))
        rec = recommend(r)
        self.recommendation.setText(" ".join(rec.reasons))
        self.build_button.setText(f"{'Rebuild' if rec.matches else 'Build'} the {rec.backend} engine")
        self.build_button.setEnabled(not self.build_proc.running)
        if frozen.is_frozen():  # no compiler and no build script in an installed app
            self.build_button.setEnabled(False)
            self.build_button.setToolTip(PACKAGED_ENGINE_NOTE)
            self.recommendation.setText(f"{self.recommendation.text()} {PACKAGED_ENGINE_NOTE}".strip())

    def build(self) -> None:
        backend = recommend(self.report).backend if self.report else "cpu"
        self.log.clear()
        self.progress.setRange(0, 0)
        self.progress.show()
        self.build_button.setEnabled(False)
        self.build_proc.start([str(BUILD_SCRIPT), "--backend", backend])

    def _on_output(self, lines: list[bytes]) -> None:
        text = b"\n".join(lines).decode("utf-8", errors="replace")
        self.log.appendPlainText(text.rstrip())
        steps = _STEP.findall(text)
        if steps:
            done, total = map(int, steps[-1])
            self.progress.setRange(0, total)
            self.progress.setValue(done)

    def _on_built(self, outcome: ProcessOutcome) -> None:
        self.progress.hide()
        self.build_button.setEnabled(True)
        if outcome.ok:
            self.log.appendPlainText("\nThe engine was built and installed. Restart the engine to use it.")
            self.refresh()
        elif not outcome.expected:
            self.log.appendPlainText(f"\nThe build failed ({outcome}); the engine that was installed is still "
                                     "in place. The log above says why.")
