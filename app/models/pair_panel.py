"""The pair a chat loads: a target and its MTP sidecar, chosen from the library (or set by a recommended
download), checked by the doctor (optionally with a live probe) and repaired into a copy that is proven in a
worker of its own before it is offered. A vision projector beside the target that fits it (the library found
it) goes with the pair: named in the label, checked by the doctor, loaded by Use in chat."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QCheckBox, QHBoxLayout, QLabel, QPushButton, QVBoxLayout, QWidget

from app import background
from app.models.library_view import LibraryView
from app.pair_proof import PairProof
from engine.store.doctor import Diagnosis, diagnose, run_probe
from engine.store.projectors import diagnose_projector


class PairPanel(QWidget):
    """Target and sidecar, with Set as target / Set as sidecar, Use in chat, the doctor and repair. Reports go to
    the library's facts panel.

    Signals:
        sig_use_model(str, str, str): load this target (and sidecar path, or "", and vision projector, or "")
            in the chat.
    """

    sig_use_model = Signal(str, str, str)

    def __init__(self, library: LibraryView, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.library = library
        self.facts = library.facts
        self._proof: PairProof | None = None
        self.target_path: str | None = None
        self.sidecar_path: str | None = None
        self.projector_path: str | None = None  # beside the target, fitting it (found by the library's scan)
        self.repaired_pair: tuple[str, str] | None = None  # (target, repaired sidecar) after a proven repair
        self.set_target = QPushButton("Set as target")
        self.set_sidecar = QPushButton("Set as sidecar")
        self.use_button = QPushButton("Use in chat")
        self.label = QLabel("Target: –   Sidecar: –   Projector: –")
        self.label.setWordWrap(True)
        self.doctor_button = QPushButton("Check pair (doctor)")
        self.probe_check = QCheckBox("Live probe")
        self.probe_check.setToolTip("Also draft a few short replies with the pair (in a separate process) and "
                                    "report how many drafts the model accepts. Takes as long as loading the model.")
        self.repair_button = QPushButton("Repair sidecar")
        self.use_repaired = QPushButton("Use repaired pair")
        self.use_repaired.setToolTip("Load the target with the repaired sidecar in the chat.")
        self.use_repaired.setVisible(False)
        choose = QHBoxLayout()
        for b in (self.set_target, self.set_sidecar, self.use_button):
            choose.addWidget(b)
        choose.addStretch(1)
        check = QHBoxLayout()
        for w in (self.doctor_button, self.probe_check, self.repair_button, self.use_repaired):
            check.addWidget(w)
        check.addStretch(1)
        col = QVBoxLayout(self)
        col.setContentsMargins(0, 0, 0, 0)
        col.addLayout(choose)
        col.addWidget(self.label)
        col.addLayout(check)

        self.set_target.clicked.connect(lambda: self._set_from_library("target"))
        self.set_sidecar.clicked.connect(lambda: self._set_from_library("sidecar"))
        self.use_button.clicked.connect(self._use)
        self.doctor_button.clicked.connect(self.run_doctor)
        self.repair_button.clicked.connect(self.run_repair)
        self.use_repaired.clicked.connect(self._use_repaired)

    def set_pair(self, target: str | None, sidecar: str | None) -> None:
        self.target_path, self.sidecar_path = target, sidecar
        self._find_projector()
        self._show_pair()

    def _set_from_library(self, which: str) -> None:
        path = self.library.selected_path()
        if path:
            setattr(self, f"{which}_path", path)
            self._find_projector()
            self._show_pair()

    def _find_projector(self) -> None:
        row = self.library.row_for(self.target_path)
        self.projector_path = row.projector if row is not None else None

    def _show_pair(self) -> None:
        """The label names the files in use: after a repair, the repaired copy, never the broken one."""
        repaired = self.repaired_pair is not None and self.repaired_pair == (self.target_path, self.sidecar_path)
        self.label.setText(f"Target: {Path(self.target_path).name if self.target_path else '–'}   "
                           f"Sidecar: {Path(self.sidecar_path).name if self.sidecar_path else '–'}"
                           + ("  (repaired copy)" if repaired else "")
                           + f"   Projector: {Path(self.projector_path).name if self.projector_path else '–'}")
        self.label.setToolTip(f"Vision projector beside the target, loaded with it: {self.projector_path}"
                              if self.projector_path else "No vision projector beside the target: it reads text only.")
        self.use_repaired.setVisible(repaired)

    # -- doctor -------------------------------------------------------------------------------------------------
    def run_doctor(self) -> None:
        if not (self.target_path and self.sidecar_path):
            self.facts.setPlainText("Choose a target and a sidecar first (Set as target / Set as sidecar).")
            return
        # headers only, but a header on a slow or network disk still waits: not on the GUI thread
        self.library.claim_facts()
        task = background.run(diagnose, self.target_path, self.sidecar_path)
        task.sig_done.connect(self._diagnosed)
        task.sig_failed.connect(self.facts.setPlainText)

    def _diagnosed(self, d: Diagnosis) -> None:
        self.facts.setPlainText(d.report())
        if self.projector_path and self.target_path:
            task = background.run(diagnose_projector, self.target_path, self.projector_path)
            task.sig_done.connect(lambda p: self.facts.appendPlainText("\n" + p.report()))
            task.sig_failed.connect(lambda msg: self.facts.appendPlainText(f"\nProjector: {msg}"))
        if self.probe_check.isChecked():
            self._probe(d)

    def _probe(self, d: Diagnosis) -> None:
        """The live probe loads the pair in a child process; waiting for it happens on a pool thread."""
        self.facts.setPlainText(d.report() + "\n\nLive probe: drafting a few short replies with the pair…")
        self.doctor_button.setEnabled(False)
        task = background.run(run_probe, d)
        task.sig_done.connect(lambda probed: self._probe_finished(probed.report()))
        task.sig_failed.connect(lambda msg: self._probe_finished(f"{d.report()}\n\nLive probe failed: {msg}"))

    def _probe_finished(self, text: str) -> None:
        self.facts.setPlainText(text)
        self.doctor_button.setEnabled(True)

    # -- repair -------------------------------------------------------------------------------------------------
    def run_repair(self) -> None:
        if not (self.target_path and self.sidecar_path):
            return
        from engine.store.repair import repair

        self.library.claim_facts()
        self.facts.setPlainText("Repairing (streaming a corrected copy), then loading it in the engine…")
        target = self.target_path
        task = background.run(repair, target, self.sidecar_path)
        task.sig_done.connect(lambda out: self._prove(target, out))
        task.sig_failed.connect(lambda msg: self.facts.setPlainText(f"Repair failed: {msg}"))

    def _prove(self, target: str, out: Path) -> None:
        """Load the repaired pair in a worker of its own (app/pair_proof.py) and draft a few tokens."""
        if self._proof is not None:
            self._proof.stop()
            self._proof.deleteLater()
        self._proof = PairProof(self)
        self._proof.sig_proved.connect(lambda proof: self._repaired(target, out, proof))
        self._proof.sig_failed.connect(lambda msg: self.facts.setPlainText(f"Repair failed: {msg}"))
        self._proof.start(target, str(out))

    def _repaired(self, target: str, out: Path, proof: str) -> None:
        """Finish the job: the repaired copy becomes the sidecar (named in the label and selected in the
        library), the result stays on screen, and one click loads the repaired pair."""
        self.repaired_pair = (target, str(out))
        self.set_pair(target, str(out))
        self.facts.setPlainText(f"Repaired: wrote {out}\n{proof}\nThe repaired copy is now the sidecar of the "
                                "pair. Use repaired pair loads it in the chat.")
        self.library.refresh(select=str(out))

    def _use_repaired(self) -> None:
        if self.repaired_pair:
            self.set_pair(*self.repaired_pair)
            self.sig_use_model.emit(*self.repaired_pair, self.projector_path or "")

    def _use(self) -> None:
        path = self.target_path or self.library.selected_path()
        if path:
            self.sig_use_model.emit(path, self.sidecar_path or "",
                                    (self.projector_path or "") if path == self.target_path else "")

    def shutdown(self) -> None:
        if self._proof is not None:
            self._proof.stop()
