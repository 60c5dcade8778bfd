"""The Models page, assembled from the widgets in ``app/models/``: the library (on disk and in the catalog) with
the target + sidecar pair, the recommended MTP models, and the hub search with its download rows over one
download queue — one tab each, so each has the page's whole height (at 1000×700 three stacked sections left
the catalog one row and pushed the window past the screen)."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QTabWidget, QVBoxLayout, QWidget

from app import background
from app.models.catalog_view import RecommendedModels
from app.models.download_queue import DownloadQueue
from app.models.downloads_view import DownloadsView
from app.models.hub_search import HubSearch
from app.models.library_view import LibraryView
from app.models.pair_panel import PairPanel
from app.models.presets import ModelRecords
from engine.store import catalog, credentials, hub


class ModelsPage(QWidget):
    """Signals:
        sig_use_model(str, str, str): load this target (and sidecar path, or "", and vision projector, or "") in
            the chat.
        sig_preset(str): the preset of the model at this path was saved.
    """

    sig_use_model = Signal(str, str, str)
    sig_preset = Signal(str)

    def __init__(self, parent: QWidget | None = None, n_ctx: int = 8192, records: ModelRecords | None = None) -> None:
        super().__init__(parent)
        self._catalog_shown = False
        self.queue = DownloadQueue(self)
        self.recommended = RecommendedModels()
        self.hub = HubSearch(self.queue)
        self.downloads = DownloadsView(self.queue)
        self.hub.column.addWidget(self.downloads)
        # 0 in the settings: "the model's own"; no header read yet
        self.library = LibraryView(n_ctx if n_ctx > 0 else 8192, records)
        self.pair = PairPanel(self.library)
        lib_box = QWidget()
        lib_col = QVBoxLayout(lib_box)
        lib_col.addWidget(self.library, 1)
        lib_col.addWidget(self.pair)
        self.recommended.setTitle("")  # the tab names them
        self.hub.setTitle("")
        self.sections = QTabWidget()
        self.sections.addTab(lib_box, "On this computer")
        self.sections.addTab(self.recommended, "Recommended MTP models")
        self.sections.addTab(self.hub, "Search Hugging Face")
        QVBoxLayout(self).addWidget(self.sections)

        self.recommended.sig_download.connect(self.download_recommended)
        self.hub.sig_offline.connect(self.recommended.set_offline)
        self.queue.sig_downloaded.connect(lambda _path: self.refresh_library())
        self.pair.sig_use_model.connect(self.sig_use_model)
        self.library.sig_preset.connect(self.sig_preset)
        self.library.sig_use_model.connect(self.sig_use_model)
        self.library.sig_download.connect(self.download_from_library)

    def follow_chat_context(self, n_ctx: int) -> None:
        self.library.follow_chat_context(n_ctx)

    def refresh_library(self, select: str | None = None) -> None:
        self.library.refresh(select)

    def showEvent(self, event: object) -> None:  # noqa: N802 (Qt's name)
        """The recommendations and the connection probe, the first time the page is seen: not at app start,
        where a network probe would serve nobody."""
        if not self._catalog_shown:
            self.show_recommended()
        super().showEvent(event)

    def show_recommended(self) -> None:
        self._catalog_shown = True
        self.recommended.refresh()

    # -- a recommended model: its files looked up, queued, and set as the pair --------------------------------
    def download_recommended(self, rec: catalog.Recommendation) -> None:
        """Look the recommendation's files up on the hub (the quantization's shards and the sidecar), then
        download them all; when every one is verified, they become the pair (On this computer)."""
        self.recommended.set_row_status(rec, "Looking up files…")
        task = background.run(lambda r: catalog.resolve(r, None, credentials.get_token()), rec)
        task.sig_done.connect(lambda resolved: self._download_resolved(rec, resolved))
        task.sig_failed.connect(lambda msg: self._recommended_failed(rec, msg))

    def download_from_library(self, repo: str) -> None:
        """A catalog row's Download in the library: the same download as its Recommended row's."""
        rec = next((r for r in self.recommended.recommendations or catalog.load() if r.repo == repo), None)
        if rec is not None:
            self.download_recommended(rec)

    def _recommended_failed(self, rec: catalog.Recommendation, msg: str) -> None:
        self.recommended.set_row_status(rec, self.recommended.download_label(rec))
        if msg.startswith(hub.UNREACHABLE):
            self.recommended.set_offline(f"{rec.repo} cannot be downloaded now.")
        else:
            self.recommended.status.setText(msg)

    def _download_resolved(self, rec: catalog.Recommendation, resolved: catalog.Resolved) -> None:
        self.recommended.show_files(rec, resolved)  # "+ projector" if the look-up on connecting missed it
        self.recommended.set_row_status(rec, "Downloading…", size=resolved.size)
        done: dict[tuple[str, str], Path] = {}
        targets = [(r, f) for r, f, _s in resolved.target]
        sidecars = [(r, f) for r, f, _s in resolved.sidecar]

        def finished(key: tuple[str, str], path: Path) -> None:
            done[key] = Path(path)
            if len(done) == len(resolved.files):
                self._recommended_downloaded(rec, done[targets[0]], done[sidecars[0]] if sidecars else None)

        for repo, name in resolved.files:
            job = self.queue.start(repo, name)  # or the job already downloading it: this pair waits on it too
            job.sig_finished.connect(lambda path, k=(repo, name): finished(k, path))
            job.sig_failed.connect(lambda _msg: self.recommended.set_row_status(rec, "Download again"))

    def _recommended_downloaded(self, rec: catalog.Recommendation, target: Path, sidecar: Path | None) -> None:
        self.pair.set_pair(str(target), str(sidecar) if sidecar else None)
        self.sections.setCurrentIndex(0)  # where the pair is, with Check pair and Use in chat
        self.recommended.set_row_status(rec, "Downloaded")
        self.recommended.status.setText(
            f"{rec.name} is downloaded and set as the pair. Check pair (doctor) to confirm the sidecar "
            "fits, then Use in chat." if sidecar else
            f"{rec.name} is downloaded and set as the target (its MTP head is in the file): Use in chat.")

    def shutdown(self) -> None:
        self.pair.shutdown()
        self.queue.cancel_all()
