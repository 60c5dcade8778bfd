"""Per-message actions beyond Edit: Delete, undoable, and Fork a conversation from a message.
(Copy is the transcript's own: it needs nothing but the text shown.)

Delete never loses a message at once: its row moves, in one transaction, to a
``deleted_messages`` table beside ``messages`` (additive: the table is made
here when first needed, nothing in ``messages`` changes shape), an "Undo" bar
shows for :data:`UNDO_MS`, and Ctrl+Z (Chat → Undo delete) or the bar's
button puts the row back under its own id, so it returns to its place. Only
when the undo window has passed, or the app quits, are the kept rows dropped;
after a crash they are still there, and the next start puts them back
(:meth:`Deletions.restore_leftovers`): nothing is removed without its undo
having had its time.

Fork makes a new conversation with the same system prompt, settings and model
and copies of the messages up to and including the one forked from (each with
its versions), so one can try another direction without touching the original.
Rows are copied column by column as the table has them, so columns added later
(images, ...) come along without this module knowing them.
"""

from __future__ import annotations

import json
import sqlite3
import time
from typing import Any

from PySide6.QtCore import QObject, QTimer, Signal
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton, QWidget

from app.chat.disk import NotSaved, transaction
from app.chat.reply_saver import refusal
from app.chat.store import ConversationStore
from app.theme import Palette

UNDO_MS = 10000  # how long a deleted message can be brought back

DELETED_TABLE = """
CREATE TABLE IF NOT EXISTS deleted_messages (
    id INTEGER PRIMARY KEY,
    conversation_id INTEGER NOT NULL,
    row TEXT NOT NULL,
    deleted REAL NOT NULL
)"""


def _columns(db: sqlite3.Connection, table: str) -> list[str]:
    return [r[1] for r in db.execute(f"PRAGMA table_info({table})")]


def fork(store: ConversationStore, message_id: int) -> int:
    """A new conversation holding copies of the messages up to and including ``message_id``; its id.
    Raises NotSaved (nothing written) when the disk refuses, KeyError when the message is gone."""
    db = store.db
    found = db.execute("SELECT conversation_id FROM messages WHERE id=?", (message_id,)).fetchone()
    if found is None:
        raise KeyError(message_id)
    source = found[0]
    conv_cols = [c for c in _columns(db, "conversations") if c != "id"]
    msg_cols = [c for c in _columns(db, "messages") if c not in ("id", "conversation_id")]
    title = store.get(source).title
    now = time.time()
    with transaction(db):
        row = db.execute(f"SELECT {', '.join(conv_cols)} FROM conversations WHERE id=?", (source,)).fetchone()
        values = dict(zip(conv_cols, tuple(row), strict=True))
        values.update(title=f"{title} (fork)", created=now, updated=now)
        marks = ", ".join("?" * len(conv_cols))
        cur = db.execute(f"INSERT INTO conversations({', '.join(conv_cols)}) VALUES ({marks})",
                         tuple(values[c] for c in conv_cols))
        new_id = int(cur.lastrowid or 0)
        cols = ", ".join(msg_cols)
        db.execute(f"INSERT INTO messages(conversation_id, {cols}) SELECT ?, {cols} FROM messages "
                   "WHERE conversation_id=? AND id<=? ORDER BY id", (new_id, source, message_id))
    return new_id


class Deletions(QObject):
    """Deleted messages, kept until their undo window passes.

    Signals:
        sig_changed(): a message was deleted, brought back or dropped for good (the undo bar follows).
    """

    sig_changed = Signal()

    def __init__(self, store: ConversationStore, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.store = store
        self._ready = False
        self.undoable: list[tuple[int, int]] = []  # (message id, conversation id), newest last
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(UNDO_MS)
        self._timer.timeout.connect(self.purge)

    def _table(self) -> None:
        if not self._ready:
            with transaction(self.store.db):
                self.store.db.execute(DELETED_TABLE)
            self._ready = True

    def delete(self, message_id: int) -> int:
        """Move the message to the deleted rows (undoable for UNDO_MS); its conversation's id.
        Raises NotSaved (nothing changed) when the disk refuses."""
        self._table()
        db = self.store.db
        row = db.execute("SELECT * FROM messages WHERE id=?", (message_id,)).fetchone()
        if row is None:
            raise KeyError(message_id)
        fields = {k: row[k] for k in row.keys()}  # noqa: SIM118 (sqlite3.Row iterates values)
        with transaction(db):
            db.execute("INSERT OR REPLACE INTO deleted_messages(id, conversation_id, row, deleted) VALUES (?,?,?,?)",
                       (message_id, fields["conversation_id"], json.dumps(fields), time.time()))
            db.execute("DELETE FROM messages WHERE id=?", (message_id,))
        self.undoable.append((message_id, int(fields["conversation_id"])))
        self._timer.start()  # a new deletion gives every one kept the whole window again
        self.sig_changed.emit()
        return int(fields["conversation_id"])

    def undo(self) -> int | None:
        """Bring back the newest deleted message; its conversation's id (None: nothing to undo, or its
        conversation was deleted meanwhile). Raises NotSaved (nothing changed) when the disk refuses."""
        while self.undoable:
            message_id, conv_id = self.undoable[-1]
            if self._put_back(message_id):
                self.undoable.pop()
                self.sig_changed.emit()
                return conv_id
            self.undoable.pop()
        return None

    def _put_back(self, message_id: int) -> bool:
        db = self.store.db
        kept = db.execute("SELECT row FROM deleted_messages WHERE id=?", (message_id,)).fetchone()
        if kept is None:
            return False
        fields: dict[str, Any] = json.loads(kept[0])
        alive = db.execute("SELECT 1 FROM conversations WHERE id=?", (fields["conversation_id"],)).fetchone()
        cols = [c for c in _columns(db, "messages") if c in fields]
        if db.execute("SELECT 1 FROM messages WHERE id=?", (message_id,)).fetchone():
            cols.remove("id")  # a message sent since took its id (it was the newest): back at the end instead
        with transaction(db):
            if alive:
                db.execute(f"INSERT INTO messages({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                           tuple(fields[c] for c in cols))
            db.execute("DELETE FROM deleted_messages WHERE id=?", (message_id,))
        return bool(alive)

    def purge(self) -> None:
        """The undo window passed (or the app quits): drop the deleted rows for good."""
        self._timer.stop()
        if not self.undoable:
            return
        ids = [m for m, _c in self.undoable]
        self.undoable = []
        try:
            with transaction(self.store.db):
                self.store.db.executemany("DELETE FROM deleted_messages WHERE id=?", [(i,) for i in ids])
        except OSError:  # a full disk: they stay kept, and the next start brings them back
            pass
        self.sig_changed.emit()

    def restore_leftovers(self) -> int:
        """Put back the messages a crash left deleted but not yet dropped (their undo never ran out); how many."""
        db = self.store.db
        if db.execute("SELECT 1 FROM sqlite_master WHERE name='deleted_messages'").fetchone() is None:
            return 0
        ids = [r[0] for r in db.execute("SELECT id FROM deleted_messages ORDER BY id")]
        return sum(self._put_back(i) for i in ids)


class MessageActions(QObject):
    """The transcript's Delete and Fork links and Undo, on the chat and the conversation list.

    Signals:
        sig_message(str, int): a status-bar message and how long to show it (ms).
    """

    sig_message = Signal(str, int)

    def __init__(self, chat: Any, conversations: Any, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.chat, self.conversations = chat, conversations
        self.deletions = Deletions(chat.store, self)
        chat.transcript.sig_message_action.connect(self.act)

    def act(self, action: str, index: int) -> None:
        shown = self.chat.transcript.messages
        message_id = shown[index].id if 0 <= index < len(shown) else None
        if message_id is None:
            return
        if action == "copy":  # the text as stored (Markdown), whole
            QGuiApplication.clipboard().setText(shown[index].content)
            self.sig_message.emit("Message copied", 2000)
            return
        if self.chat.busy:
            self.sig_message.emit(f"Stop the reply first to {action} a message.", 4000)
            return
        if action == "delete":
            self.delete(message_id)
        elif action == "fork":
            self.fork(message_id)

    def delete(self, message_id: int) -> None:
        try:
            conv_id = self.deletions.delete(message_id)
        except NotSaved as exc:
            self.sig_message.emit(refusal(exc, "the message was not deleted. Free some space and try again."), 10000)
            return
        self._show(conv_id)

    def undo(self) -> None:
        """Bring the newest deleted message back, and show its conversation."""
        if self.chat.busy:
            self.sig_message.emit("Stop the reply first to bring a message back.", 4000)
            return
        try:
            conv_id = self.deletions.undo()
        except NotSaved as exc:
            self.sig_message.emit(refusal(exc, "the message was not brought back yet. Free some space and press "
                                               "Undo again."), 10000)
            return
        if conv_id is not None:
            self._show(conv_id)

    def fork(self, message_id: int) -> None:
        try:
            conv_id = fork(self.chat.store, message_id)
        except NotSaved as exc:
            self.sig_message.emit(refusal(exc, "no fork was made. Free some space and try again."), 10000)
            return
        self._show(conv_id)
        self.sig_message.emit("A copy of the conversation up to that message is open; the original is unchanged.",
                              5000)

    def _show(self, conv_id: int) -> None:
        self.chat.open(conv_id)
        self.conversations.refresh()


class UndoBar(QFrame):
    """"Message deleted. [Undo]" above the transcript while a deletion can be undone.

    Signals:
        sig_undo(): Undo was pressed.
    """

    sig_undo = Signal()

    def __init__(self, palette: Palette, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setStyleSheet(f"UndoBar {{ background:{palette.code_bg}; border-radius:4px; }}")
        row = QHBoxLayout(self)
        row.setContentsMargins(8, 2, 4, 2)
        self.label = QLabel()
        self.undo_button = QPushButton("Undo")
        self.undo_button.setToolTip("Bring the deleted message back (Ctrl+Z)")
        self.undo_button.clicked.connect(self.sig_undo)
        row.addWidget(self.label, 1)
        row.addWidget(self.undo_button)
        self.hide()

    def follow(self, deletions: Deletions) -> None:
        deletions.sig_changed.connect(lambda: self.show_count(len(deletions.undoable)))

    def show_count(self, count: int) -> None:
        self.label.setText("Message deleted." if count == 1 else f"{count} messages deleted.")
        self.setVisible(count > 0)
