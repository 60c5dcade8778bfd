"""The models on this computer: the library list, each model's header facts and its memory estimate at a
context size, folders to add. The facts panel is shared with the pair's doctor and repair, which claim it."""

from __future__ import annotations

from PySide6.QtCore import QSignalBlocker, Qt
from PySide6.QtWidgets import (
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from app import background
from engine.store import fit, library


def facts_lines(path: str, n_ctx: int) -> list[str]:
    """A model's header facts and its memory estimate at ``n_ctx``, as lines (or why not)."""
    from engine.gguf.facts import read_facts

    try:
        lines = read_facts(path).summary_lines()
        est = fit.estimate(path, n_ctx=n_ctx)
        return [*lines, "", f"memory at n_ctx {n_ctx}:", *("  " + ln for ln in est.lines())]
    except Exception as exc:
        return [str(exc)]


class LibraryView(QWidget):
    """The library list beside the facts panel, with Add folder…, Refresh and the estimate's context."""

    def __init__(self, n_ctx: int, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._running = background.Running()
        self._scan_generation = 0
        self._facts_generation = 0
        self.entries = QListWidget()
        self.facts = QPlainTextEdit()
        self.facts.setReadOnly(True)
        self.add_folder_button = QPushButton("Add folder…")
        self.refresh_button = QPushButton("Refresh")
        self.ctx = QSpinBox(minimum=256, maximum=1_048_576, singleStep=4096, value=n_ctx)
        self.ctx.setToolTip("The context the memory estimate assumes. It starts at the chat's context (the load "
                            "sheet's setting) and follows it; change it here to see what another size would need.")
        split = QSplitter(Qt.Orientation.Horizontal)
        split.addWidget(self.entries)
        split.addWidget(self.facts)
        buttons = QHBoxLayout()
        buttons.addWidget(self.add_folder_button)
        buttons.addWidget(self.refresh_button)
        buttons.addStretch(1)
        buttons.addWidget(QLabel("Context"))
        buttons.addWidget(self.ctx)
        col = QVBoxLayout(self)
        col.setContentsMargins(0, 0, 0, 0)
        col.addWidget(split, 1)
        col.addLayout(buttons)

        self.add_folder_button.clicked.connect(self._add_folder)
        self.refresh_button.clicked.connect(lambda: self.refresh())
        self.entries.currentItemChanged.connect(self._show_facts)
        self.ctx.valueChanged.connect(lambda _v: self._show_facts(self.entries.currentItem(), None))

    def follow_chat_context(self, n_ctx: int) -> None:
        """Estimate memory at the context the chat actually uses (called when the chat's context changes)."""
        if n_ctx > 0 and n_ctx != self.ctx.value():
            self.ctx.setValue(n_ctx)

    def refresh(self, select: str | None = None) -> None:
        """Rescan the library; ``select`` (a path) becomes the selected row, else the selection is kept."""
        self._scan_generation += 1
        generation = self._scan_generation
        task = self._running.add(background.run(library.scan))
        task.sig_done.connect(lambda entries: self._show_library(entries, generation, select))

    def _show_library(self, entries: list[library.LibraryEntry], generation: int,
                      select: str | None = None) -> None:
        """Rebuild the list without signals: a rebuild changes the current row, and reading that row's facts
        would overwrite what the panel shows (a repair's result, the doctor's report)."""
        if generation != self._scan_generation:
            return  # a newer scan is under way; scans may finish out of order
        keep = select or self.selected_path()
        with QSignalBlocker(self.entries):
            self.entries.clear()
            for e in entries:
                label = e.path.name + (f"  ·  {e.facts.architecture}, MTP {e.facts.nextn_layers} ({e.layout})"
                                       if e.facts else "  ·  unreadable")
                item = QListWidgetItem(label)
                item.setData(Qt.ItemDataRole.UserRole, str(e.path))
                item.setToolTip(str(e.path) if e.facts else e.problem or "")
                self.entries.addItem(item)
                if keep and str(e.path) == keep:  # strings: no filesystem call per row on the GUI thread
                    self.entries.setCurrentItem(item)

    def selected_path(self) -> str | None:
        item = self.entries.currentItem()
        return item.data(Qt.ItemDataRole.UserRole) if item else None

    def claim_facts(self) -> None:
        """The panel is about to show something else (the doctor, a repair): drop a facts read under way."""
        self._facts_generation += 1

    def _show_facts(self, item: QListWidgetItem | None, _prev: object) -> None:
        """Header facts and the memory fit, read on the background runner (a
        spin of the context box must not read a header on the GUI thread)."""
        path = item.data(Qt.ItemDataRole.UserRole) if item else None
        if not path:
            return
        self._facts_generation += 1
        generation = self._facts_generation
        task = self._running.add(background.run(facts_lines, path, self.ctx.value()))
        task.sig_done.connect(lambda lines: self._show_facts_lines(lines, generation))

    def _show_facts_lines(self, lines: list[str], generation: int) -> None:
        if generation == self._facts_generation:  # a newer read is under way otherwise
            self.facts.setPlainText("\n".join(lines))

    def _add_folder(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Add a folder of models")
        if folder:
            library.add_folder(folder)
            self.refresh()
