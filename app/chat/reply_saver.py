"""Writes a streaming reply to the store, and keeps it when the disk will not take it.

A full disk must not cost the reply nor stop the chat: a write the store
refuses (:class:`~app.chat.store.NotSaved`) is kept here, the chat is told
once ("disk full, not saved"), and the write is made again on a timer and
before the next write, until the disk takes it. Only the newest value of
each field is kept, so a reply that streams on a full disk costs memory for
its text, not for every attempt.

The chat's other writes (Regenerate, a version switch, an edit) first make
the writes waiting here, so they never overwrite a newer reply with an older
one; on a full disk they are refused with :func:`refusal`'s words.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QObject, QTimer, Signal

from app.chat.store import ConversationStore, DiskFull, NotSaved

RETRY_INTERVAL_MS = 3000  # how soon freed space is noticed; a failed write costs next to nothing


def refusal(exc: NotSaved, what: str) -> str:
    """The user's message for a write the disk refused: why, then ``what`` (what was not done, what to do)."""
    why = "The disk is full" if isinstance(exc, DiskFull) else str(exc)[:1].upper() + str(exc)[1:]
    return f"{why}: {what}"


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
        self.error: NotSaved | None = None  # why the last try failed (None once everything is saved)
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
                self.error = exc
                if not had_failed:
                    self.sig_notice.emit(not_saved_notice(exc))
                    self._timer.start()
                return False
            del self._pending[message_id]
        self.error = None
        if had_failed:
            self._timer.stop()
            self.sig_notice.emit("")
            self.sig_saved.emit()
        return True

    def write_waiting(self) -> None:
        """Write what waits, or raise why it cannot be written (before a write that must follow it).

        Raises:
            NotSaved: the disk still refuses it.
        """
        if not self.flush():
            assert self.error is not None
            raise self.error

    def discard(self) -> None:
        """Give up what waits (the user chose to quit without it)."""
        self._pending.clear()
        self._timer.stop()

    def waiting_for(self, message_id: int) -> dict[str, Any]:
        """The fields of a message that wait for the disk (what the chat shows in place of the stored ones)."""
        return dict(self._pending.get(message_id, {}))

    def waiting_chars(self) -> int:
        """How much reply text waits for the disk (what quitting now would lose)."""
        return sum(len(fields.get("content") or "") for fields in self._pending.values())
