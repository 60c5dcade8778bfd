"""The rows under the hub search: one per download job, drawing what its job reports (progress, speed, how it
ended) with a Cancel button. The jobs live in :class:`~app.models.download_queue.DownloadQueue`."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtWidgets import QHBoxLayout, QLabel, QProgressBar, QPushButton, QVBoxLayout, QWidget

from app.models.download_queue import DownloadJob, DownloadQueue
from engine.store.download import Progress


def progress_text(p: Progress) -> str:
    """"120/800 MiB, 12.3 MiB/s, resumed at 40 MiB"."""
    resumed = f", resumed at {p.resumed_from / 2**20:.0f} MiB" if p.resumed_from else ""
    return f"{p.done / 2**20:.0f}/{p.total / 2**20:.0f} MiB, {p.bytes_per_s / 2**20:.1f} MiB/s{resumed}"


class DownloadRow(QWidget):
    """One job: name, progress, speed (then how it ended), cancel."""

    def __init__(self, job: DownloadJob, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.job = job
        self.filename = job.filename
        self.label = QLabel(job.filename)
        self.bar = QProgressBar()
        self.speed = QLabel("queued")
        self.cancel = QPushButton("Cancel")
        self.cancel.clicked.connect(job.cancel)
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.label, 2)
        row.addWidget(self.bar, 3)
        row.addWidget(self.speed, 2)
        row.addWidget(self.cancel)
        job.sig_progress.connect(self.show_progress)
        job.sig_finished.connect(self._finished)
        job.sig_failed.connect(self._ended)

    def show_progress(self, p: Progress) -> None:
        self.bar.setRange(0, 1000)
        self.bar.setValue(int(1000 * p.done / p.total) if p.total else 0)
        self.speed.setText(progress_text(p))

    def _finished(self, _path: Path) -> None:
        self._ended("done, verified")

    def _ended(self, text: str) -> None:
        self.speed.setText(text)
        self.cancel.setEnabled(False)


class DownloadsView(QWidget):
    """A row for every job the queue starts, in the order they started."""

    def __init__(self, queue: DownloadQueue, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.rows = QVBoxLayout(self)
        self.rows.setContentsMargins(0, 0, 0, 0)
        for job in queue.jobs:
            self._add(job)
        queue.sig_added.connect(self._add)

    def _add(self, job: DownloadJob) -> None:
        self.rows.addWidget(DownloadRow(job))

    def row_of(self, job: DownloadJob) -> DownloadRow:
        """The row that draws ``job``."""
        return next(r for r in (self.rows.itemAt(i).widget() for i in range(self.rows.count()))
                    if isinstance(r, DownloadRow) and r.job is job)
