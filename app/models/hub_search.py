"""Search the hub for GGUF repositories, list a repository's quantizations (and its MTP sidecar), and queue the
selected files for download; the access token is saved here too.

Offline, a search says so in a line of its own (whole, wrapped: a list row cut it off) and searches the
built-in catalog instead, so the models the app knows are still found by name."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QPushButton,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app import background
from app.models.download_queue import DownloadJob, DownloadQueue
from engine.store import catalog, credentials, hub


def catalog_matches(query: str) -> list[catalog.Recommendation]:
    """The built-in catalog's models whose name, architecture or repository holds every word of ``query``."""
    words = query.lower().split()
    try:
        recs = catalog.load()
    except catalog.CatalogError:
        return []
    return [r for r in recs if all(w in f"{r.name} {r.arch} {r.repo} {r.quant}".lower() for w in words)]


class HubSearch(QGroupBox):
    """Signals:
        sig_offline(str): a search found the hub out of reach (the recommendations say so too).
    """

    sig_offline = Signal(str)

    def __init__(self, queue: DownloadQueue, parent: QWidget | None = None) -> None:
        super().__init__("Hugging Face", parent)
        self.queue = queue
        self._repo = ""
        self._groups: list[hub.FileGroup] = []
        self.query = QLineEdit()
        self.query.setPlaceholderText("Search GGUF models, e.g. Qwen3.6 MTP")
        self.search_button = QPushButton("Search")
        self.token = QLineEdit()
        self.token.setEchoMode(QLineEdit.EchoMode.Password)
        self.token.setPlaceholderText("Access token (kept in the system keyring)")
        save_token = QPushButton("Save token")
        self.results = QListWidget()
        self.results.setWordWrap(True)  # a row's end (the repository, "built-in catalog") is read, not scrolled to
        self.results.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.files = QTableWidget(0, 4)
        self.files.setHorizontalHeaderLabels(["Quantization", "Size", "Kind", "Files"])
        self.files.horizontalHeader().setStretchLastSection(True)
        self.files.setSelectionBehavior(QTableWidget.SelectionBehavior.SelectRows)
        self.sidecar_hint = QLabel()
        self.sidecar_hint.setWordWrap(True)
        self.download_button = QPushButton("Download selected")
        self.status = QLabel()  # why a search found nothing on the hub (offline, an error), whole
        self.status.setWordWrap(True)
        self.status.hide()
        top = QHBoxLayout()
        top.addWidget(self.query, 1)
        top.addWidget(self.search_button)
        tok = QHBoxLayout()
        tok.addWidget(self.token, 1)
        tok.addWidget(save_token)
        lists = QSplitter(Qt.Orientation.Horizontal)
        lists.addWidget(self.results)
        lists.addWidget(self.files)
        lists.setSizes([250, 450])
        self.column = QVBoxLayout(self)
        self.column.addLayout(top)
        self.column.addLayout(tok)
        self.column.addWidget(self.status)
        self.column.addWidget(lists, 1)
        self.column.addWidget(self.sidecar_hint)
        self.column.addWidget(self.download_button)

        save_token.clicked.connect(self.save_token)
        self.search_button.clicked.connect(self.search)
        self.query.returnPressed.connect(self.search)
        self.results.currentItemChanged.connect(self._show_repo)
        self.download_button.clicked.connect(self.download_selected)
        queue.sig_already_running.connect(self._already_running)

    def search(self) -> None:
        query = self.query.text().strip()
        if not query:
            return
        self.results.clear()
        self.status.hide()
        self.results.addItem("Searching…")
        # the token lookup may wait on the system keyring: never on the GUI thread
        task = background.run(lambda q: hub.search(q, 30, None, credentials.get_token()), query)
        task.sig_done.connect(self._show_results)
        task.sig_failed.connect(self._search_failed)

    def _search_failed(self, msg: str) -> None:
        self.results.clear()
        self.status.show()
        if not msg.startswith(hub.UNREACHABLE):
            self.status.setText(f"Search failed: {msg}")
            return
        self.status.setText(f"Offline: {msg.rstrip('.')}.")
        self.sig_offline.emit("a search just found the hub out of reach.")
        task = background.run(catalog_matches, self.query.text())  # reads the catalog's file
        task.sig_done.connect(lambda found: self._show_catalog(msg, found))

    def _show_catalog(self, msg: str, found: list[catalog.Recommendation]) -> None:
        self.status.setText(f"Offline: {msg.rstrip('.')}. " + (f"{len(found)} model(s) in the built-in catalog match; "
                                                    "download them from Recommended MTP models once online."
                                                    if found else "Nothing in the built-in catalog matches."))
        for rec in found:
            item = QListWidgetItem(f"{rec.name}  ·  {rec.repo}  ·  built-in catalog")
            item.setToolTip(rec.note or rec.repo)  # no repository data: its files cannot be listed offline
            self.results.addItem(item)

    def _show_results(self, repos: list[hub.RepoSummary]) -> None:
        self.results.clear()
        for r in repos:
            item = QListWidgetItem(f"{r.repo_id}  ·  {r.downloads} downloads")
            item.setData(Qt.ItemDataRole.UserRole, r.repo_id)
            self.results.addItem(item)
        if not repos:
            self.results.addItem("No GGUF repositories found.")

    def _show_repo(self, item: QListWidgetItem | None, _prev: object) -> None:
        repo = item.data(Qt.ItemDataRole.UserRole) if item else None
        if not repo:
            return
        self.files.setRowCount(0)
        task = background.run(lambda r: hub.repo_files(r, None, credentials.get_token()), repo)
        task.sig_done.connect(lambda groups: self._show_files(repo, groups))
        task.sig_failed.connect(lambda msg: self.sidecar_hint.setText(f"Could not list files: {msg}"))

    def _show_files(self, repo: str, groups: list[hub.FileGroup]) -> None:
        self._repo, self._groups = repo, groups
        self.files.setRowCount(len(groups))
        for i, g in enumerate(groups):
            kind = "MTP sidecar" if g.is_mtp else "vision projector" if g.is_projector else \
                "model" + (f", {g.shards} shards" if g.shards > 1 else "")
            values = [g.quant, f"{g.size / 2**30:.2f} GiB", kind, ", ".join(g.files)]
            for j, v in enumerate(values):
                self.files.setItem(i, j, QTableWidgetItem(v))
        side = hub.suggest_sidecar(repo, groups)
        projectors = [g for g in groups if g.is_projector]
        vision = (f" Vision projector here: {projectors[0].files[0]} ({projectors[0].size / 2**30:.2f} GiB); "
                  "select its row too to read images.") if projectors else ""
        self.sidecar_hint.setText((f"MTP sidecar for this model: {side[0]} — {side[1]}." if side
                                   else "No MTP sidecar known for this repository.") + vision)

    def download_selected(self) -> None:
        """Queue every file of the selected rows (a sharded quantization is several files)."""
        rows = sorted({i.row() for i in self.files.selectedIndexes()})
        for row in rows:
            for name in self._groups[row].files:
                self.queue.start(self._repo, name)

    def _already_running(self, job: DownloadJob) -> None:
        self.sidecar_hint.setText(f"{job.filename} is already downloading (see its progress below).")

    def save_token(self) -> None:
        token = self.token.text().strip()
        if token:
            self.token.clear()
            # the keyring may wait on a desktop service: never on the GUI thread
            task = background.run(credentials.set_token, token)
            task.sig_done.connect(lambda saved: self.token.setPlaceholderText(
                "Token saved in the keyring" if saved else
                "No keyring on this system: set HF_TOKEN in the environment instead"))
