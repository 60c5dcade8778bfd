""""Recommended MTP models": the catalog's known MTP families, shown before any
search and without a network, each with its size, a fit badge against this
machine's memory and one Download button for the target and its sidecar.

Once the hub answers, each recommendation's files are looked up (``catalog.resolve``, off the GUI thread):
the row then shows the hub's size for exactly what Download fetches, and a vision model's row says
"+ projector" with the projector's size (its Target cell and its button), so the user sees the extra file
before clicking rather than in the download list after.

Whether the hub can be reached is probed once (a TCP connect with a 3 s limit,
``engine.store.hub.unreachable_reason``) and said in plain words above the list,
so an offline user learns it at once rather than from a search that retries for
23 s and ends in a socket error.
"""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QBrush, QColor
from PySide6.QtWidgets import (
    QGroupBox,
    QHeaderView,
    QLabel,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app import background
from engine.store import catalog, credentials, fit, hub

COLUMNS = ["Model", "Target", "MTP heads", "Size", "This computer", ""]
_BADGE_COLOUR = {"fits": "#1a7f37", "tight fit": "#9a6700", "does not fit": "#cf222e"}


def _gib(n: int | None) -> str:
    return "size unknown" if n is None else f"≈ {n / 2**30:.1f} GiB"


def load_rows() -> tuple[list[catalog.Recommendation], int | None]:
    """The recommendations and this machine's available memory (read off the GUI thread: the catalog is a
    file in the install folder, and available memory may come from a system call)."""
    return catalog.load(), fit.available_memory()


def _paint_badge(item: QTableWidgetItem, verdict: str) -> None:
    """Colour and weight for the verdict, so a glance down the column tells what fits."""
    font = item.font()
    font.setBold(verdict in _BADGE_COLOUR)
    item.setFont(font)
    if verdict in _BADGE_COLOUR:
        item.setForeground(QBrush(QColor(_BADGE_COLOUR[verdict])))


class RecommendedModels(QGroupBox):
    """Signals:
        sig_download(object): a ``catalog.Recommendation`` whose target (and sidecar) should be downloaded.
    """

    sig_download = Signal(object)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("Recommended MTP models", parent)
        self.recommendations: list[catalog.Recommendation] = []
        self.available: int | None = None
        self.online: bool | None = None  # None until the probe has answered
        self.projectors: dict[str, int] = {}  # repository -> bytes of the vision projector its download brings
        self._tasks: list[background.Task] = []
        self.status = QLabel("Checking the connection to Hugging Face…")
        self.status.setWordWrap(True)
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.verticalHeader().setVisible(False)
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.table.setSelectionBehavior(QTableWidget.SelectionBehavior.SelectRows)
        # the rows reflow: the three text columns share the width and wrap, the figures and the button keep
        # theirs, and no column hides the Download buttons behind a sideways scroll
        self.table.setWordWrap(True)
        self.table.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        for column in (0, 1, 2):
            header.setSectionResizeMode(column, QHeaderView.ResizeMode.Stretch)
        header.sectionResized.connect(lambda *_a: self.table.resizeRowsToContents())
        self.buttons: list[QPushButton] = []
        col = QVBoxLayout(self)
        col.addWidget(self.status)
        col.addWidget(self.table, 1)

    def _track(self, task: background.Task) -> background.Task:
        self._tasks.append(task)
        task.sig_done.connect(lambda _r: self._tasks.remove(task) if task in self._tasks else None)
        task.sig_failed.connect(lambda _r: self._tasks.remove(task) if task in self._tasks else None)
        return task

    def refresh(self) -> None:
        """Fill the list from the catalog and probe the hub, both on the pool."""
        task = self._track(background.run(load_rows))
        task.sig_done.connect(lambda rows: self._show(*rows))
        task.sig_failed.connect(self.status.setText)
        probe = self._track(background.run(hub.unreachable_reason))
        probe.sig_done.connect(self._probed)
        probe.sig_failed.connect(lambda msg: self._probed(f"the connection check failed ({msg})"))

    def _probed(self, reason: str | None) -> None:
        self.online = reason is None
        if reason is None:
            for rec in self.recommendations:
                self._look_up(rec)
            self.status.setText("Connected to Hugging Face. Download fetches a recommended model (and its MTP "
                                "sidecar); Search Hugging Face for others.")
        else:
            self.set_offline(f"Hugging Face cannot be reached: {reason}.")

    def _look_up(self, rec: catalog.Recommendation) -> None:
        """The files Download would fetch, asked of the hub now (a failure leaves the catalog's figures: the
        Download click asks again and says why)."""
        task = self._track(background.run(lambda r: catalog.resolve(r, None, credentials.get_token()), rec))
        task.sig_done.connect(lambda resolved: self.show_files(rec, resolved))

    def download_label(self, rec: catalog.Recommendation) -> str:
        """The idle Download button's words: what one click fetches."""
        extras = [part for part, has in (("sidecar", rec.sidecar is not None),
                                         ("projector", rec.repo in self.projectors)) if has]
        return " + ".join(["Download model", *extras]) if extras else "Download"

    def show_files(self, rec: catalog.Recommendation, resolved: catalog.Resolved) -> None:
        """The hub's answer for ``rec``: its real size, and "+ projector" with the projector's size when one
        comes with the download."""
        if rec not in self.recommendations:
            return
        row = self.recommendations.index(rec)
        idle = self.buttons[row].text() == self.download_label(rec)
        target = f"{rec.repo} ({rec.quant})"
        if resolved.projector:
            self.projectors[rec.repo] = sum(size for _r, _f, size in resolved.projector)
            target += f" + projector ({self.projectors[rec.repo] / 2**30:.2f} GiB)"
            self.table.item(row, 1).setToolTip("With the vision projector its repository ships: "
                                               + ", ".join(name for _r, name, _s in resolved.projector))
        self.table.item(row, 1).setText(target)
        self.set_row_status(rec, self.download_label(rec) if idle else self.buttons[row].text(), resolved.size)
        self.table.resizeRowsToContents()

    def set_offline(self, why: str) -> None:
        """Say plainly that the hub is out of reach and what still works."""
        self.online = False
        self.status.setText(f"Offline — {why} These recommendations come from the built-in catalog; "
                            "connect to the internet to download them or to search for others.")

    def _show(self, recs: list[catalog.Recommendation], available: int | None) -> None:
        self.recommendations, self.available = recs, available
        self.table.setRowCount(len(recs))
        self.buttons = []
        for i, rec in enumerate(recs):
            heads = ("in the model file" if rec.sidecar is None else f"sidecar: {rec.sidecar.repo}")
            estimate = catalog.fit_estimate(rec.total_size, available)
            verdict = catalog.badge(estimate)
            cells = [rec.name, f"{rec.repo} ({rec.quant})", heads, _gib(rec.total_size), verdict]
            for j, text in enumerate(cells):
                item = QTableWidgetItem(text)
                item.setToolTip(self._tooltip(rec, estimate) if j in (3, 4) else (rec.note or text))
                self.table.setItem(i, j, item)
            _paint_badge(self.table.item(i, 4), verdict)
            button = QPushButton(self.download_label(rec))
            button.setToolTip("Downloads the target's files" + (" and its MTP sidecar" if rec.sidecar else
                                                                 " (its MTP head is inside)")
                              + ", with the vision projector (mmproj) when its repository ships one, beside it "
                              "(the load sheet offers it); the model and sidecar are then set as the pair "
                              "(On this computer).")
            button.clicked.connect(lambda _c=False, r=rec: self.sig_download.emit(r))
            self.table.setCellWidget(i, 5, button)
            self.buttons.append(button)
            if self.online:  # the probe answered before the catalog was read
                self._look_up(rec)
        self.table.resizeRowsToContents()

    def _tooltip(self, rec: catalog.Recommendation, estimate: fit.MemoryEstimate | None,
                 basis: str | None = None) -> str:
        if estimate is None:
            return ("The catalog has no size for this model; the hub's size is shown once it is looked up "
                    "(Download, or search for the repository).")
        basis = basis if basis is not None else rec.size_basis
        basis = f" Size: {basis}." if basis else ""
        memory = (f"{estimate.available / 2**30:.1f} GiB available now" if estimate.available is not None
                  else "available memory unknown")
        return (f"Weights ≈ {estimate.weights / 2**30:.1f} GiB against {memory}.{basis} The context (KV cache) "
                "and compute buffers come on top; the exact estimate is on the right once the file is on disk.")

    def set_row_status(self, rec: catalog.Recommendation, text: str, size: int | None = None) -> None:
        """Show a download's state in the recommendation's button; with ``size``, the hub's real size and
        the fit badge recomputed from it."""
        if rec not in self.recommendations:
            return
        row = self.recommendations.index(rec)
        self.buttons[row].setText(text)
        if size is not None:
            estimate = catalog.fit_estimate(size, self.available)
            self.table.item(row, 3).setText(f"{size / 2**30:.2f} GiB")
            verdict = catalog.badge(estimate)
            self.table.item(row, 4).setText(verdict)
            for col in (3, 4):
                self.table.item(row, col).setToolTip(self._tooltip(rec, estimate, "the hub's, for these files"))
            _paint_badge(self.table.item(row, 4), verdict)
