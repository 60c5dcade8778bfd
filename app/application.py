"""The composition root: builds the services, wires them, runs the event loop.

One app per data folder (:class:`InstanceGuard`): a second one would take
the first one's streaming reply for one left by a crash and mark it
interrupted (the store's recovery on open), and both would write the same
conversations. A second start asks the first to show its window and exits.

A data folder that cannot be written (a full disk, no permission) is no
second instance and no damaged database: the app says so in a dialog and
exits, the conversations database untouched (:class:`CannotStart`).
"""

from __future__ import annotations

import hashlib
import shutil
import sys
from pathlib import Path

from PySide6.QtCore import QLockFile, QObject, QTimer, Signal
from PySide6.QtGui import QIcon
from PySide6.QtNetwork import QLocalServer, QLocalSocket
from PySide6.QtWidgets import QApplication, QMessageBox

from app.chat.store import DiskFull, NotSaved
from app.engine_client import EngineClient
from app.hardware_probe import HardwareProbe
from app.main_window import MainWindow
from app.settings import Settings
from app.store_rescue import open_store
from engine import paths
from engine.build_record import app_version

ICON = Path(__file__).resolve().parents[1] / "assets" / "icons" / "mtp-studio-256.png"
ANSWER_TIMEOUT_MS = 3000  # how long a second start waits for the first to answer


NO_ROOM_BYTES = 1 << 20  # less free space than this is a full disk for the app (SQLite's index alone takes 32 KiB)


def no_room(folder: Path) -> bool:
    """Whether ``folder``'s disk is (as good as) full for this user; SQLite reports some full disks as I/O errors."""
    try:
        return shutil.disk_usage(folder).free < NO_ROOM_BYTES
    except OSError:
        return False


class CannotStart(RuntimeError):
    """The data folder cannot be written (a full disk, no permission); the message says what to do."""


class AlreadyRunning(RuntimeError):
    """Another MTP Studio has this data folder open."""


class InstanceGuard(QObject):
    """Holds the data folder for this app: a lock file, and a local socket on
    which a second start asks this one to raise its window.

    The lock is a ``QLockFile``: a lock whose holder died (a crash, SIGKILL)
    is taken over, by PID, so a crash never locks the user out.

    Signals:
        sig_raise_requested(): a second start asked this app to show itself.
    """

    sig_raise_requested = Signal()

    def __init__(self, data_dir: Path, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.data_dir = data_dir
        self._lock = QLockFile(str(self.lock_path(data_dir)))
        self._lock.setStaleLockTime(0)  # by age never: a live holder keeps its lock however long it runs
        self._server: QLocalServer | None = None

    @staticmethod
    def lock_path(data_dir: Path) -> Path:
        return data_dir / "mtp-studio.lock"

    @staticmethod
    def server_name(data_dir: Path) -> str:
        """Short and per folder: socket paths are limited to about 100 bytes."""
        return "mtp-studio-" + hashlib.sha256(str(data_dir.resolve()).encode()).hexdigest()[:16]

    def acquire(self) -> None:
        """Take the data folder, or raise :class:`AlreadyRunning` having touched nothing in it.

        Raises:
            AlreadyRunning: another app holds the lock.
            CannotStart: the lock file cannot be written (a full disk, a read-only folder).
        """
        if not self._lock.tryLock(0):
            if self._lock.error() == QLockFile.LockError.LockFailedError:
                raise AlreadyRunning(f"MTP Studio is already running with the data folder {self.data_dir}.")
            full = no_room(self.data_dir)
            why = ("its disk is full" if full else
                   "permission denied" if self._lock.error() == QLockFile.LockError.PermissionError
                   else "it cannot be written")
            raise CannotStart(f"MTP Studio cannot write to its data folder {self.data_dir} ({why}). "
                              + ("Free some space on that disk and start MTP Studio again." if full else
                                 "Make the folder writable and start MTP Studio again."))
        name = self.server_name(self.data_dir)
        QLocalServer.removeServer(name)  # a socket a crashed holder left; the lock says none is live
        self._server = QLocalServer(self)
        self._server.newConnection.connect(self._on_connection)
        self._server.listen(name)  # if this fails, a second start only cannot raise this window

    def release(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        self._lock.unlock()

    def _on_connection(self) -> None:
        assert self._server is not None
        while self._server.hasPendingConnections():
            self._server.nextPendingConnection().deleteLater()  # connecting is the whole request
        self.sig_raise_requested.emit()

    @classmethod
    def ask_to_raise(cls, data_dir: Path) -> bool:
        """Ask the app holding ``data_dir`` to show its window; False when none answered."""
        socket = QLocalSocket()
        socket.connectToServer(cls.server_name(data_dir))
        answered = socket.waitForConnected(ANSWER_TIMEOUT_MS)
        socket.disconnectFromServer()
        return answered


class Services:
    """Everything the window needs, built once; tests build the same thing.

    Raises:
        AlreadyRunning: another app holds the data folder; nothing was opened.
        CannotStart: the data folder cannot be written; nothing in it was changed.
    """

    def __init__(self) -> None:
        # first: the store's recovery must never run on another app's live replies
        self.instance = InstanceGuard(paths.data_dir())
        self.instance.acquire()
        # a damaged file of either kind is set aside or reset, never a reason not to start
        self.settings, notices = Settings.read()
        try:
            self.store, store_notices = open_store(paths.data_dir() / "conversations.sqlite3")
        except NotSaved as exc:  # a full disk: the database is sound, and kept as it is
            self.instance.release()
            why = "its disk is full" if isinstance(exc, DiskFull) or no_room(paths.data_dir()) else str(exc)
            raise CannotStart(f"MTP Studio cannot open its conversations in {paths.data_dir()} ({why}). "
                              "Free some space on that disk and start MTP Studio again.") from exc
        self.notices = [*notices, *store_notices]
        self.client = EngineClient()
        # One probe for the app: its fingerprint keys autotune profiles, and
        # the Hardware page and the autotune wizard show its report.
        self.probe = HardwareProbe()
        self.window = MainWindow(self.settings, self.store, self.client, self.probe, self.notices)
        self.instance.sig_raise_requested.connect(self.raise_window)

    def start(self) -> None:
        self.window.show()
        self.client.start()
        self.probe.ensure()

    def raise_window(self) -> None:
        """Bring the window to the front (a second start asked for it)."""
        if self.window.isMinimized():
            self.window.showNormal()
        self.window.show()
        self.window.raise_()
        self.window.activateWindow()

    def shutdown(self) -> None:
        self.probe.stop()
        self.client.stop()
        self.window.chat.saver.flush()  # one more try for a reply that waited for the disk
        self.settings.try_save()  # the window's close already told the user what is not saved
        self.store.close()
        self.instance.release()


def hand_over(exc: AlreadyRunning) -> int:
    """A second start: ask the running app to show itself, say so, and exit."""
    data_dir = paths.data_dir()
    if InstanceGuard.ask_to_raise(data_dir):
        print(f"{exc} Its window was brought to the front.", file=sys.stderr)
        return 0
    print(f"{exc} It did not answer within {ANSWER_TIMEOUT_MS / 1000:.0f} s. If no MTP Studio is running, "
          f"delete {InstanceGuard.lock_path(data_dir)} and start again.", file=sys.stderr)
    return 1


def run(argv: list[str], smoke: bool = False) -> int:
    """The event loop; with ``smoke`` the app drives itself through app/smoke.py and exits with its outcome."""
    app = QApplication.instance() or QApplication([sys.argv[0], *argv])
    app.setApplicationName("MTP Studio")
    app.setOrganizationName("MTP Studio")
    app.setApplicationVersion(app_version())
    app.setWindowIcon(QIcon(str(ICON)))
    try:
        services = Services()
    except AlreadyRunning as exc:
        return hand_over(exc)
    except CannotStart as exc:
        print(f"error: {exc}", file=sys.stderr)
        QMessageBox.critical(None, "MTP Studio cannot start", str(exc))
        return 1
    services.start()
    if smoke:
        from app.smoke import SmokeTest

        smoke_test = SmokeTest(services)
        smoke_test.sig_finished.connect(app.exit)
        QTimer.singleShot(0, smoke_test.begin)  # once the loop has shown the window
    try:
        return int(app.exec())
    finally:
        services.shutdown()
