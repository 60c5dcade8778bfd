"""The models on this computer and in the catalog: the library list with its search and filters (has MTP,
fits this machine, architecture, quantization, on disk or in the catalog), each model's header facts and its
memory estimate at a context size, its preset (app/models/presets.py), folders to add. The facts panel is
shared with the pair's doctor and repair, which claim it."""

from __future__ import annotations

from collections.abc import Callable

import shiboken6
from PySide6.QtCore import QSignalBlocker, Qt, Signal
from PySide6.QtGui import QBrush, QPalette
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QLineEdit,
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
from app.models.library_rows import LibraryFilter, LibraryRow, label, scan_rows, size_text
from app.models.presets import ModelRecords
from app.settings import Settings
from engine.store import fit, library

ROW_ROLE = Qt.ItemDataRole.UserRole + 1  # the row's LibraryRow; UserRole holds the path (None: catalog only)
WHERE_LABELS = {"all": "On this computer and in the catalog", "disk": "On this computer", "catalog": "In the catalog"}


def facts_lines(path: str, n_ctx: int, swa_full: bool = False) -> list[str]:
    """A model's header facts and its memory estimate at ``n_ctx``, as lines (or why not); ``swa_full``: the
    preference that a sliding-window model keeps its whole cache (Settings.swa_full), as the load will."""
    from engine.gguf.facts import read_facts

    try:
        lines = read_facts(path).summary_lines()
        est = fit.estimate(path, n_ctx=n_ctx, swa_full=swa_full)
        return [*lines, "", f"memory at n_ctx {n_ctx}:", *("  " + ln for ln in est.lines())]
    except Exception as exc:
        return [str(exc)]


def catalog_lines(row: LibraryRow) -> list[str]:
    """What the catalog says of a model not downloaded yet (no header to read)."""
    return [row.name, f"repository    {row.repo}", f"architecture  {row.architecture}",
            f"quantization  {row.quantization}", f"size          about {size_text(row.size)}",
            f"MTP           {row.mtp}",
            "", "Download fetches it (and its sidecar)."]


class LibraryView(QWidget):
    """The library list beside the facts panel: search and filters above, Add folder…, Refresh, Preset…,
    Download (a catalog model) and the estimate's context below.

    Signals:
        sig_preset(str): the preset of the model at this path was saved.
        sig_use_model(str, str, str): load this file in the chat (no sidecar: ""), with the vision projector
            beside it that fits it ("" for none).
        sig_download(str): download the catalog's model from this repository (its Download button).
        sig_rows(list): a scan ended: every LibraryRow (the chat's model picker searches them).
    """

    sig_preset = Signal(str)
    sig_use_model = Signal(str, str, str)
    sig_download = Signal(str)
    sig_rows = Signal(list)

    def __init__(self, n_ctx: int, records: ModelRecords | None = None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.records = records or ModelRecords()
        self.preferences: Settings | None = None  # the app's (main_window sets them): a new preset starts there
        self.fingerprint: Callable[[], str | None] = lambda: None  # this machine's (main_window sets it): autotune
        self._scan_generation = 0
        self._facts_generation = 0
        self._rows: list[LibraryRow] = []
        self.entries = QListWidget()
        self.entries.setWordWrap(True)  # long rows wrap: no sideways scrolling at any width
        self.entries.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.facts = QPlainTextEdit()
        self.facts.setReadOnly(True)
        self.search = QLineEdit()
        self.search.setPlaceholderText("Search models")
        self.search.setClearButtonEnabled(True)
        self.where = QComboBox()
        for key, text in WHERE_LABELS.items():
            self.where.addItem(text, key)
        self.architecture = QComboBox()
        self.quantization = QComboBox()
        self.mtp_only = QCheckBox("Has MTP")
        self.fits_only = QCheckBox("Fits this machine")
        self.add_folder_button = QPushButton("Add folder…")
        self.refresh_button = QPushButton("Refresh")
        self.preset_button = QPushButton("Preset…")
        self.preset_button.setToolTip("Sampling, context, threads, system prompt and chat template this model "
                                      "brings when it loads")
        self.preset_button.setEnabled(False)
        self.download_button = QPushButton("Download")
        self.download_button.setToolTip("Download the selected catalog model (and its MTP sidecar); it is listed "
                                        "here when it is done")
        self.download_button.setEnabled(False)
        self.ctx = QSpinBox(minimum=256, maximum=1_048_576, singleStep=4096, value=n_ctx)
        self.ctx.setToolTip("The context the memory estimate assumes. It starts at the chat's context (the load "
                            "sheet's setting) and follows it; change it here to see what another size would need.")
        split = QSplitter(Qt.Orientation.Horizontal)
        split.addWidget(self.entries)
        split.addWidget(self.facts)
        split.setStretchFactor(0, 3)
        split.setStretchFactor(1, 2)
        # two rows, and combos sized by a few characters, not their longest entry: in one row the filters
        # made the whole window at least 817 px wide (an 800 px screen could not hold it)
        for combo in (self.where, self.architecture, self.quantization):
            combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
            combo.setMinimumContentsLength(10)
        search_row = QHBoxLayout()
        search_row.addWidget(self.search, 1)
        search_row.addWidget(self.where)
        choice_row = QHBoxLayout()
        for widget in (self.architecture, self.quantization, self.mtp_only, self.fits_only):
            choice_row.addWidget(widget)
        choice_row.addStretch(1)
        filters = QVBoxLayout()
        filters.addLayout(search_row)
        filters.addLayout(choice_row)
        buttons = QHBoxLayout()
        buttons.addWidget(self.add_folder_button)
        buttons.addWidget(self.refresh_button)
        buttons.addWidget(self.preset_button)
        buttons.addWidget(self.download_button)
        buttons.addStretch(1)
        buttons.addWidget(QLabel("Context"))
        buttons.addWidget(self.ctx)
        col = QVBoxLayout(self)
        col.setContentsMargins(0, 0, 0, 0)
        col.addLayout(filters)
        col.addWidget(split, 1)
        col.addLayout(buttons)
        self._fill_choices()

        self.add_folder_button.clicked.connect(self._add_folder)
        self.refresh_button.clicked.connect(lambda: self.refresh())
        self.preset_button.clicked.connect(lambda: self.edit_preset())
        self.download_button.clicked.connect(self._download)
        self.entries.currentItemChanged.connect(self._show_facts)
        self.entries.itemActivated.connect(self._use)  # Enter or a double click on a file loads it
        self.ctx.valueChanged.connect(lambda _v: self.refresh_facts())
        self.search.textChanged.connect(lambda _t: self._fill())
        for combo in (self.where, self.architecture, self.quantization):
            combo.currentIndexChanged.connect(lambda _i: self._fill())
        for box in (self.mtp_only, self.fits_only):
            box.toggled.connect(lambda _on: self._fill())

    def follow_chat_context(self, n_ctx: int) -> None:
        """Estimate memory at the context the chat actually uses (called when the chat's context changes)."""
        if n_ctx > 0 and n_ctx != self.ctx.value():
            self.ctx.setValue(n_ctx)

    def refresh(self, select: str | None = None) -> None:
        """Rescan the library; ``select`` (a path) becomes the selected row, else the selection is kept."""
        self._scan_generation += 1
        generation = self._scan_generation
        task = background.run(scan_rows, self.records.last_used(), self.fingerprint())
        task.sig_done.connect(lambda rows: self._show_library(rows, generation, select))

    def _show_library(self, rows: list[LibraryRow], generation: int, select: str | None = None) -> None:
        if not shiboken6.isValid(self.entries) or generation != self._scan_generation:
            return  # the page was closed meanwhile, or a newer scan is under way (scans may finish out of order)
        keep = select or self.selected_path()
        self._rows = rows
        self._fill_choices()
        self._fill(keep)
        self.sig_rows.emit(rows)

    def _fill_choices(self) -> None:
        """The architecture and quantization filters offer what the rows hold (the choice made is kept)."""
        for combo, anything, values in (
                (self.architecture, "Any architecture", {r.architecture for r in self._rows}),
                (self.quantization, "Any quantization", {r.quantization for r in self._rows})):
            chosen = combo.currentData() or ""
            with QSignalBlocker(combo):
                combo.clear()
                combo.addItem(anything, "")
                for value in sorted(values - {"?"}):
                    combo.addItem(value, value)
                combo.setCurrentIndex(max(0, combo.findData(chosen)))

    def current_filter(self) -> LibraryFilter:
        return LibraryFilter(self.search.text(), self.where.currentData(), self.mtp_only.isChecked(),
                             self.fits_only.isChecked(), self.architecture.currentData() or "",
                             self.quantization.currentData() or "")

    def _fill(self, keep: str | None = None) -> None:
        """Rebuild the list from the rows the filters let through, without signals: a rebuild changes the
        current row, and reading that row's facts would overwrite what the panel shows (a repair's result,
        the doctor's report)."""
        keep = keep or self.selected_path()
        flt = self.current_filter()
        muted = QBrush(self.palette().color(QPalette.ColorRole.PlaceholderText))
        with QSignalBlocker(self.entries):
            self.entries.clear()
            for row in self._rows:
                if not flt.matches(row):
                    continue
                item = QListWidgetItem(label(row))
                item.setData(Qt.ItemDataRole.UserRole, row.path)
                item.setData(ROW_ROLE, row)
                item.setToolTip(row.problem or row.path or f"{row.repo} (in the catalog, not downloaded)")
                if not row.on_disk:
                    item.setForeground(muted)
                self.entries.addItem(item)
                if keep and row.path == keep:  # strings: no filesystem call per row on the GUI thread
                    self.entries.setCurrentItem(item)
        self._enable_buttons(self.entries.currentItem())

    def rows_shown(self) -> list[LibraryRow]:
        return [self.entries.item(i).data(ROW_ROLE) for i in range(self.entries.count())]

    def _use(self, item: QListWidgetItem) -> None:
        path = item.data(Qt.ItemDataRole.UserRole)
        if path and item.data(ROW_ROLE).architecture != "?":
            self.sig_use_model.emit(path, "", item.data(ROW_ROLE).projector or "")

    def _enable_buttons(self, item: QListWidgetItem | None) -> None:
        row = item.data(ROW_ROLE) if item else None
        self.preset_button.setEnabled(row is not None and row.on_disk)
        self.download_button.setEnabled(row is not None and not row.on_disk and row.repo is not None)

    def _download(self) -> None:
        item = self.entries.currentItem()
        row = item.data(ROW_ROLE) if item else None
        if row is not None and not row.on_disk and row.repo:
            self.claim_facts()
            self.facts.setPlainText(f"Downloading {row.name} from {row.repo}… Its progress is under Search Hugging "
                                    "Face; it is listed here when it is done.")
            self.sig_download.emit(row.repo)

    def row_for(self, path: str | None) -> LibraryRow | None:
        """The row of the file at ``path`` (None: not in the library, or not scanned yet)."""
        return next((r for r in self._rows if path is not None and r.path == path), None)

    def selected_path(self) -> str | None:
        item = self.entries.currentItem()
        return item.data(Qt.ItemDataRole.UserRole) if item else None

    def edit_preset(self) -> object:
        """The preset sheet of the selected model; OK saves it (and says so with ``sig_preset``)."""
        from app.models.preset_dialog import PresetDialog

        path = self.selected_path()
        if path is None:
            return None
        prefs = self.preferences or Settings()  # what applies where the preset leaves a part to the preferences
        dialog = PresetDialog(path, self.records.preset(path), prefs.sampling, prefs.n_ctx, prefs.n_threads, self)
        dialog.accepted.connect(lambda: self._save_preset(path, dialog.preset()))
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.open()
        return dialog

    def _save_preset(self, path: str, preset: object) -> None:
        problem = self.records.set_preset(path, preset)  # type: ignore[arg-type]
        self.claim_facts()  # a header read under way must not hide what happened
        self.facts.setPlainText(f"The preset for {path} could not be saved: {problem}. It applies until MTP "
                                "Studio quits." if problem else f"Preset saved for {path}: it applies when the "
                                "model loads.")
        self.sig_preset.emit(path)

    def claim_facts(self) -> None:
        """The panel is about to show something else (the doctor, a repair): drop a facts read under way."""
        self._facts_generation += 1

    def refresh_facts(self) -> None:
        """Read the selected model's facts and estimate again (the preferences it follows changed)."""
        self._show_facts(self.entries.currentItem(), None)

    def _show_facts(self, item: QListWidgetItem | None, _prev: object) -> None:
        """Header facts and the memory fit, read on the background runner (a
        spin of the context box must not read a header on the GUI thread)."""
        self._enable_buttons(item)
        path = item.data(Qt.ItemDataRole.UserRole) if item else None
        if not path:
            row = item.data(ROW_ROLE) if item else None
            if row is not None:  # in the catalog only: what the catalog says, no header to read
                self.claim_facts()
                self.facts.setPlainText("\n".join(catalog_lines(row)))
            return
        self._facts_generation += 1
        generation = self._facts_generation
        task = background.run(facts_lines, path, self.ctx.value(), (self.preferences or Settings()).swa_full)
        task.sig_done.connect(lambda lines: self._show_facts_lines(lines, generation))

    def _show_facts_lines(self, lines: list[str], generation: int) -> None:
        # a newer read is under way otherwise; or the page was closed meanwhile
        if generation == self._facts_generation and shiboken6.isValid(self.facts):
            self.facts.setPlainText("\n".join(lines))

    def _add_folder(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Add a folder of models")
        if folder:
            library.add_folder(folder)
            self.refresh()
