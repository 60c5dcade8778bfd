"""The download queue: one job per file being fetched from the hub, owned here, not by the rows that show them.

The model side of the Models page's downloads (qutebrowser's downloads split): a :class:`DownloadJob` holds a
file's progress and how it ended and says so in signals; :class:`DownloadQueue` starts jobs, refuses a second
job for a file that is still downloading (the engine's lock would only refuse it with an error), and cancels
them all at shutdown. The widgets in ``downloads_view.py`` only draw what the jobs report.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QObject, Signal

from app import background
from engine import paths
from engine.store import credentials
from engine.store.download import Progress, download


def models_folder(repo: str) -> Path:
    """Where a repository's files go: one folder per repository under the data folder's ``models``."""
    return paths.data_dir() / "models" / repo.replace("/", "__")


class DownloadJob(QObject):
    """One file's download, from start to verified file or failure.

    Signals:
        sig_progress(Progress): bytes done, total, speed (often, while it runs).
        sig_finished(Path): the file is downloaded and its hash checked.
        sig_failed(str): the download ended without a file (cancelled, or an error); the text says which.
    """

    sig_progress = Signal(object)
    sig_finished = Signal(object)
    sig_failed = Signal(str)

    def __init__(self, repo: str, filename: str, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.repo, self.filename = repo, filename
        self.progress: Progress | None = None
        self.path: Path | None = None  # set when it finished
        self.error: str | None = None  # set when it failed
        self.cancel_event = threading.Event()  # read by the download on its pool thread
        self._task: background.Task | None = None  # kept alive while it runs

    @property
    def key(self) -> tuple[str, str]:
        return self.repo, self.filename

    @property
    def running(self) -> bool:
        return self.path is None and self.error is None

    def cancel(self) -> None:
        """Ask the download to stop; it ends in :attr:`sig_failed`, keeping the partial file for a resume."""
        self.cancel_event.set()

    def _run(self, dest: Path) -> None:
        self._task = background.run(
            lambda r, f, d, report: download(r, f, d, token=credentials.get_token(), progress=report,
                                             cancel=self.cancel_event),
            self.repo, self.filename, dest, with_report=True)
        self._task.sig_progress.connect(self._on_progress)
        self._task.sig_done.connect(self._on_done)
        self._task.sig_failed.connect(self._on_failed)

    def _on_progress(self, progress: Progress) -> None:
        self.progress = progress
        self.sig_progress.emit(progress)

    def _on_done(self, path: object) -> None:
        self.path, self._task = Path(str(path)), None
        self.sig_finished.emit(self.path)

    def _on_failed(self, message: str) -> None:
        self.error, self._task = message, None
        self.sig_failed.emit(message)


class DownloadQueue(QObject):
    """Every download the page started, in order, with at most one running job per file.

    Signals:
        sig_added(DownloadJob): a job was started (a view adds its row).
        sig_already_running(DownloadJob): a file asked for again is still downloading; that job goes on.
        sig_downloaded(Path): some job finished with a verified file (the library rescans).
    """

    sig_added = Signal(object)
    sig_already_running = Signal(object)
    sig_downloaded = Signal(object)

    def __init__(self, parent: QObject | None = None,
                 folder: Callable[[str], Path] = models_folder) -> None:
        super().__init__(parent)
        self.jobs: list[DownloadJob] = []
        self._folder = folder

    def running(self, repo: str, filename: str) -> DownloadJob | None:
        return next((j for j in self.jobs if j.running and j.key == (repo, filename)), None)

    def start(self, repo: str, filename: str) -> DownloadJob:
        """Start downloading ``filename`` of ``repo``, or return the job already downloading it.

        Connect to the job's signals right after this call: it cannot end before control returns to Qt's event
        loop, so no signal is missed, for a new job or a running one.
        """
        job = self.running(repo, filename)
        if job is not None:
            self.sig_already_running.emit(job)
            return job
        job = DownloadJob(repo, filename, self)
        self.jobs.append(job)
        job.sig_finished.connect(self.sig_downloaded)
        self.sig_added.emit(job)
        job._run(self._folder(repo))
        return job

    def cancel_all(self) -> None:
        for job in self.jobs:
            if job.running:
                job.cancel()
