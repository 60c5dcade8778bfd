"""Writes a streaming reply to the store, and keeps it when the disk will not take it.

A full disk must not cost the reply nor stop the chat: a write the store
refuses (:class:`~app.chat.store.NotSaved`) is kept here, the chat is told
once ("disk full, not saved"), and the write is made again on a timer and
before the next write, until the disk takes it. Only the newest value of
each field is kept, so a reply that streams on a full disk costs memory for
its text, not for every attempt.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QObject, QTimer, Signal

from app.chat.store import ConversationStore, DiskFull, NotSaved

RETRY_INTERVAL_MS = 3000  # how soon freed space is noticed; a failed write costs next to nothing


def not_saved_notice(exc: NotSaved) -> str:
    """What the chat says while a reply waits for the disk."""
    if isinstance(exc, DiskFull):
        return ("Disk full, not saved: the reply is kept here and will be saved as soon as there is space "
                "(free some space in the data folder's disk).")
    return f"Not saved: {exc}. The reply is kept here and saving is retried every few seconds."


class ReplySaver(QObject):
    """The store's writes for replies, retried until they land.

    Signals:
        sig_notice(str): the chat's saving notice; "" once everything waiting was saved.
        sig_saved(): what was waiting reached the disk.
    """

    sig_notice = Signal(str)
    sig_saved = Signal()

    def __init__(self, store: ConversationStore, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.store = store
        self._pending: dict[int, dict[str, Any]] = {}  # message id -> the fields to write
        self._timer = QTimer(self)
        self._timer.setInterval(RETRY_INTERVAL_MS)
        self._timer.timeout.connect(self.flush)

    @property
    def waiting(self) -> bool:
        """True while some write has not reached the disk."""
        return bool(self._pending)

    def save(self, message_id: int, **fields: Any) -> bool:
        """Write ``fields`` (as :meth:`ConversationStore.update_message` takes them) to a message.

        Returns:
            True when it, and everything that waited before it, is on disk; False when it is kept to retry.
        """
        waiting = self._pending.setdefault(message_id, {})
        waiting.update({k: v for k, v in fields.items() if v is not None})
        return self.flush()

    def flush(self) -> bool:
        """Try every waiting write again (the timer's slot, and before each new write)."""
        had_failed = self._timer.isActive()
        while self._pending:
            message_id, fields = next(iter(self._pending.items()))
            try:
                self.store.update_message(message_id, **fields)
            except NotSaved as exc:
                if not had_failed:
                    self.sig_notice.emit(not_saved_notice(exc))
                    self._timer.start()
                return False
            del self._pending[message_id]
        if had_failed:
            self._timer.stop()
            self.sig_notice.emit("")
            self.sig_saved.emit()
        return True
