"""The load sheet: how to load one model — context size, CPU threads, GPU
layers, MTP and its sidecar, the vision projector — with a memory bar that
says, before anything is loaded, whether that will fit this machine.

The projectors offered are those in the model's folder (where its repository
puts ``mmproj-*.gguf``), each checked against the model as the doctor checks
it, and any other file the user chooses; a new model gets the first that fits.

Loading a model too big for memory gets the worker killed by the system, so
the estimate (``engine.store.fit``) is shown for exactly the settings that
will be sent, the context included. Reading the header and estimating touch
the model file (possibly on a slow disk), so both run on the background
runner; a result that a newer change overtook is dropped.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from PySide6.QtCore import QTimer, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QDialog,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app import background
from app.load_choice import LoadChoice
from app.load_plan import (
    MemoryPlan,
    ProjectorOption,
    SheetFacts,
    gpu_offload_reason,
    numbered_plan,
    projector_option,
    read_sheet_facts,
    vram_from_report,
)
from app.memory_bar import fill_memory_bar
from app.projector_box import CHOOSE, ProjectorBox
from engine.hardware.probe import HardwareReport

MAX_CTX = 2**24  # the protocol's limit
MAX_THREADS = 512  # the protocol's limit
ESTIMATE_DELAY_MS = 250  # a spin box held down asks once, not once per step
GIB = 2**30


class LoadSheet(QDialog):
    """Signals:
        sig_load(LoadChoice): the user asked to load the model this way.
        sig_eject(): the user asked to unload the model that is loaded.
    """

    sig_load = Signal(object)
    sig_eject = Signal()

    def __init__(self, choice: LoadChoice, backend: str | None, report: HardwareReport | None,
                 loaded: str | None, parent: QWidget | None = None, propose_projector: bool = False,
                 swa_full: bool = False) -> None:
        """``propose_projector``: choose the first projector beside the model that fits it (another model
        than the one loaded), else keep ``choice.mmproj``. ``swa_full``: the preference that a
        sliding-window model keep its whole cache, which the memory estimate counts."""
        super().__init__(parent)
        self.propose_projector = propose_projector
        self.swa_full = swa_full
        self.setWindowTitle("Load a model")
        self.choice = choice
        self.facts: SheetFacts | None = None
        self.plan: MemoryPlan | None = None
        self.sidecar_path = choice.sidecar
        self._vram_have = vram_from_report(report)
        self._estimates = 0  # a result a newer change overtook is dropped

        self.title = QLabel(f"<b>{Path(choice.path).name if choice.path else 'The built-in model'}</b>")
        self.path_label = QLabel(choice.path or "Gemma 3 270M, shipped with MTP Studio")
        self.path_label.setWordWrap(True)
        self.ctx = QSpinBox()
        self.ctx.setRange(256, MAX_CTX)
        self.ctx.setSingleStep(1024)
        self.ctx.setSuffix(" tokens")
        self.ctx.setValue(max(256, choice.n_ctx))
        self.ctx.setToolTip("n_ctx: how many tokens (system prompt, conversation and reply) the model sees at "
                            "once. More context takes more memory: watch the bar below.")
        self.ctx_hint = QLabel("")
        self.threads = QSpinBox()
        self.threads.setRange(1, MAX_THREADS)
        self.threads.setValue(max(1, min(MAX_THREADS, choice.n_threads)))
        self.threads.setToolTip(f"n_threads: CPU threads for decoding. This machine has {os.cpu_count() or 1} "
                                "logical cores. On a quiet machine the physical core count is usually fastest; "
                                "when another program keeps a core busy, every thread waits for the one sharing "
                                "it, so the default leaves one core free. Autotune measures both.")
        self.gpu_layers = QSpinBox()
        self.gpu_layers.setRange(0, 999)
        self.gpu_layers.setValue(max(0, choice.n_gpu_layers))
        self.gpu_reason = QLabel(gpu_offload_reason(backend))
        self.gpu_reason.setWordWrap(True)
        if self.gpu_reason.text():
            self.gpu_layers.setValue(0)
            self.gpu_layers.setEnabled(False)
            self.gpu_layers.setToolTip(self.gpu_reason.text())
        else:
            self.gpu_layers.setToolTip("n_gpu_layers: how many layers run on the GPU; the rest run on the CPU.")
            self.gpu_reason.hide()
        self.mtp = QCheckBox("Draft with multi-token prediction (MTP)")
        self.mtp.setChecked(choice.mtp)
        self.mtp.setToolTip("Loads the model's MTP heads (or the sidecar's) so replies can be drafted several "
                            "tokens at a time and checked in one batch. Off: plain decoding, less memory.")
        self.mtp_reason = QLabel("")
        self.mtp_reason.setWordWrap(True)
        self.mtp_reason.hide()
        self.sidecar_label = QLabel()
        self.sidecar_button = QPushButton("Choose…")
        self.clear_sidecar_button = QPushButton("Clear")
        self.projector = ProjectorBox()
        self.ram_bar = QProgressBar()
        self.vram_bar = QProgressBar()
        for bar in (self.ram_bar, self.vram_bar):
            bar.setRange(0, 1000)
            bar.setTextVisible(True)
            bar.setFormat("estimating…")
        self.vram_bar.hide()
        self.memory_text = QLabel("Estimating the memory this needs…")
        self.memory_text.setWordWrap(True)
        self.eject_button = QPushButton("Eject")
        self.eject_button.setEnabled(loaded is not None)
        self.eject_button.setToolTip(f"Unload {loaded} and free its memory." if loaded else "No model is loaded.")
        self.cancel_button = QPushButton("Cancel")
        self.load_button = QPushButton("Load")
        self.load_button.setDefault(True)
        self.load_button.setEnabled(False)  # until the header was read: a file that is no model is said here

        sidecar_row = QHBoxLayout()
        sidecar_row.addWidget(self.sidecar_label, 1)
        sidecar_row.addWidget(self.sidecar_button)
        sidecar_row.addWidget(self.clear_sidecar_button)
        form = QFormLayout()
        for hint in (self.ctx_hint, self.gpu_reason, self.mtp_reason):
            hint.setWordWrap(True)
            hint.setStyleSheet("color:palette(placeholder-text); padding-left:12px;")
        # the explanations span the whole row: a wrapped label in the field column gets too little height
        form.addRow("Context size", self.ctx)
        form.addRow(self.ctx_hint)
        form.addRow("CPU threads", self.threads)
        form.addRow("GPU layers", self.gpu_layers)
        form.addRow(self.gpu_reason)
        form.addRow("MTP", self.mtp)
        form.addRow(self.mtp_reason)
        form.addRow("MTP sidecar", sidecar_row)
        form.addRow("Vision projector", self.projector)
        form.addRow("Memory (RAM)", self.ram_bar)
        form.addRow("Memory (GPU)", self.vram_bar)
        form.labelForField(self.vram_bar).hide()
        buttons = QHBoxLayout()
        buttons.addWidget(self.eject_button)
        buttons.addStretch(1)
        buttons.addWidget(self.cancel_button)
        buttons.addWidget(self.load_button)
        col = QVBoxLayout(self)
        col.addWidget(self.title)
        col.addWidget(self.path_label)
        col.addLayout(form)
        col.addWidget(self.memory_text)
        col.addLayout(buttons)
        self._form = form
        self.setMinimumWidth(560)

        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(ESTIMATE_DELAY_MS)
        self._timer.timeout.connect(self._estimate)
        for box in (self.ctx, self.gpu_layers):
            box.valueChanged.connect(self._timer.start)
        self.mtp.toggled.connect(self._timer.start)
        self.projector.activated.connect(self._projector_chosen)
        self.sidecar_button.clicked.connect(self._choose_sidecar)
        self.clear_sidecar_button.clicked.connect(lambda: self.set_sidecar(None))
        self.cancel_button.clicked.connect(self.reject)
        self.load_button.clicked.connect(self._load)
        self.eject_button.clicked.connect(self._eject)
        self._show_sidecar()
        self._track(background.run(read_sheet_facts, choice.path, choice.mmproj), self._on_facts,
                    self._on_facts_failed)

    # -- what the user chose ------------------------------------------------------
    def current_choice(self) -> LoadChoice:
        # a model without heads leaves the MTP preference as it was, for the next model that has them
        mtp = self.mtp.isChecked() if self.mtp.isEnabled() else self.choice.mtp
        return LoadChoice(self.choice.path, self.sidecar_path, self.ctx.value(), self.threads.value(),
                          self.gpu_layers.value() if self.gpu_layers.isEnabled() else 0, mtp, self.mmproj)

    @property
    def mmproj(self) -> str | None:
        """The projector chosen (None: none)."""
        return self.projector.chosen

    def set_projector(self, path: str | None) -> None:
        """Choose projector ``path`` (None: none); a file not offered yet is checked against the model first."""
        if path is not None and path not in self.projector.options:
            self._track(background.run(projector_option, self.facts.path if self.facts else self.choice.path or "",
                                       path), self._on_projector_checked, self._on_facts_failed)
            return
        self.projector.show_choice(path)
        self._timer.start()

    def _projector_chosen(self, index: int) -> None:
        if self.projector.itemData(index) != CHOOSE:
            self.set_projector(self.projector.itemData(index))
            return
        self.projector.setCurrentIndex(0)
        start = str(Path(self.choice.path).parent) if self.choice.path else str(Path.home())
        path, _ = QFileDialog.getOpenFileName(self, "Choose a vision projector", start, "GGUF (*.gguf)")
        self.set_projector(path or None)

    def _on_projector_checked(self, option: ProjectorOption) -> None:
        self.projector.offer(option)
        self.set_projector(option.path)

    def set_sidecar(self, path: str | None) -> None:
        self.sidecar_path = path or None
        self._show_sidecar()
        self._timer.start()

    def _choose_sidecar(self) -> None:
        start = str(Path(self.choice.path).parent) if self.choice.path else str(Path.home())
        path, _ = QFileDialog.getOpenFileName(self, "Choose an MTP sidecar", start, "GGUF (*.gguf)")
        if path:
            self.set_sidecar(path)

    def _show_sidecar(self) -> None:
        self.sidecar_label.setText(Path(self.sidecar_path).name if self.sidecar_path else "none")
        self.sidecar_label.setToolTip(self.sidecar_path or "An MTP sidecar holds the MTP heads of a model "
                                      "exported without them (a trunk-only file).")
        self.clear_sidecar_button.setEnabled(self.sidecar_path is not None)
        self._update_mtp()

    def _update_mtp(self) -> None:
        """MTP needs heads: the model's own or a sidecar's. Say so rather than offer a box that does nothing."""
        if self.facts is None:
            return
        can = self.facts.has_mtp or self.sidecar_path is not None
        if can != self.mtp.isEnabled():
            self.mtp.setChecked(self.choice.mtp if can else False)  # a disabled box shows what will happen: no MTP
        self.mtp.setEnabled(can)
        reason = "" if can else ("This model has no MTP heads, so replies decode plainly. Choose an MTP sidecar "
                                 "below to draft with one.")
        self.mtp_reason.setText(reason)
        self.mtp_reason.setVisible(bool(reason))

    def _load(self) -> None:
        self.sig_load.emit(self.current_choice())
        self.accept()

    def _eject(self) -> None:
        self.sig_eject.emit()
        self.accept()

    # -- background work ------------------------------------------------------------
    def _track(self, task: background.Task, done: Any, failed: Any) -> None:
        """``done`` and ``failed`` must be bound methods of this sheet, which Qt disconnects when the sheet
        is deleted (the task itself is held by the background relay until it ends)."""
        task.sig_done.connect(done)
        task.sig_failed.connect(failed)

    def _on_facts(self, facts: SheetFacts) -> None:
        self.facts = facts
        self.projector.add_choose_item()
        for option in facts.projectors:
            self.projector.offer(option)
        fitting = next((o.path for o in facts.projectors if o.fits), None)
        self.set_projector(fitting if self.propose_projector and self.choice.mmproj is None else self.choice.mmproj)
        self.gpu_layers.setMaximum(max(1, facts.layers + 1))  # the +1: the output layer
        if self.choice.n_ctx == 0 and facts.n_ctx_train:  # 0 in the settings: the model's own context
            self.ctx.setValue(min(MAX_CTX, facts.n_ctx_train))
        if facts.n_ctx_train:
            self.ctx_hint.setText(f"The model was trained with {facts.n_ctx_train:,} tokens of context; "
                                  "more than that may give poor replies.")
        self._update_mtp()
        self.load_button.setEnabled(True)
        self.adjustSize()  # the explanations that just appeared wrap: make room for their lines
        self._estimate()

    def _on_facts_failed(self, message: str) -> None:
        self.memory_text.setText(f"This file cannot be loaded: {message} Choose another file.")
        for bar in (self.ram_bar, self.vram_bar):
            bar.setFormat("—")

    def _estimate(self) -> None:
        if self.facts is None:
            return
        self._estimates += 1
        serial, choice = self._estimates, self.current_choice()
        share = min(1.0, choice.n_gpu_layers / max(1, self.facts.layers + 1))
        option = self.projector.options.get(choice.mmproj or "")
        task = background.run(numbered_plan, serial, self.facts.path, choice.n_ctx, choice.sidecar, choice.mtp,
                              share, self._vram_have, option.size if option else 0, self.swa_full)
        self._track(task, self._on_plan, self._on_facts_failed)

    def _on_plan(self, result: tuple[int, MemoryPlan | None, str]) -> None:
        serial, plan, error = result
        if serial != self._estimates:
            return
        if plan is None:
            self.memory_text.setText(f"The memory needed cannot be estimated: {error}")
            return
        self.plan = plan
        ram_have = plan.estimate.available
        fill_memory_bar(self.ram_bar, plan.ram_need, ram_have, "available RAM")
        offloading = plan.vram_need > 0
        self.vram_bar.setVisible(offloading)
        self._form.labelForField(self.vram_bar).setVisible(offloading)
        if offloading:
            fill_memory_bar(self.vram_bar, plan.vram_need, plan.vram_have, "GPU memory")
        over = [what for need, have, what in ((plan.ram_need, ram_have, "RAM"),
                                              (plan.vram_need, plan.vram_have, "GPU memory"))
                if need and have is not None and need > have]
        if over:
            verdict = (f"This will not fit in {' or '.join(over)}: lower the context size"
                       + (" or the GPU layers" if "GPU memory" in over else "") + ", or choose a smaller model.")
        elif ram_have is not None and plan.ram_need > 0.8 * ram_have:
            verdict = "This fits, but tightly: other programs may push the system into swapping."
        else:
            verdict = "This fits."
        projector = f", the vision projector's {plan.projector / GIB:.2f} GiB included" if plan.projector else ""
        self.memory_text.setText(f"About {plan.total / GIB:.2f} GiB at {self.ctx.value():,} tokens of "
                                 f"context{projector}. {verdict}")
        self.memory_text.setToolTip("\n".join(plan.estimate.lines() + (
            [f"vision projector  {plan.projector / 2**20:,.0f} MiB"] if plan.projector else [])))

