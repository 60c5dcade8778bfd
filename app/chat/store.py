"""Conversations on disk: SQLite in WAL mode in the data folder.

A reply is written while it streams (status ``streaming``), so a killed app
or worker loses at most the last fraction of a second; on the next start,
or when the worker dies, such a reply is marked ``interrupted`` and kept.
No Qt here: the store is plain Python and tested as such.

A message may have versions, kept in its row (``app/chat/versions.py``): a
reply's regenerations, and an edited message's branches. Older databases
gain the new columns when opened (:meth:`ConversationStore._migrate`);
nothing is rewritten. Rows are decoded in ``app/chat/rows.py``; exports are
written by ``app/chat/export.py``.

Every write goes through ``app/chat/disk.py``: one the disk cannot take raises
:class:`NotSaved` and leaves the database as it was. A turn's two rows (the
message and its empty reply) are written in one transaction, and so is an
edit (the branch kept, the new version and its reply row), so a full disk
never leaves a message without its reply row or an edit half done.

Images attached to a user message are kept in the database, by hash
(``app/chat/attachments.py`` says why), written in the turn's transaction.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

from app.chat import export, rows, versions
from app.chat.attachments import Attachment
from app.chat.disk import DiskFull, NotSaved, storable, transaction, writing
from app.chat.rows import Conversation, Message

__all__ = ["ConversationStore", "Conversation", "Message", "NotSaved", "DiskFull", "storable", "writing"]

SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    id INTEGER PRIMARY KEY,
    title TEXT NOT NULL,
    system_prompt TEXT NOT NULL DEFAULT '',
    settings TEXT NOT NULL DEFAULT '{}',
    created REAL NOT NULL,
    updated REAL NOT NULL,
    model TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY,
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    status TEXT NOT NULL DEFAULT 'complete',
    stats TEXT,
    created REAL NOT NULL,
    versions TEXT NOT NULL DEFAULT '[]',
    version INTEGER NOT NULL DEFAULT 0,
    images TEXT NOT NULL DEFAULT '[]'
);
CREATE INDEX IF NOT EXISTS messages_by_conversation ON messages(conversation_id, id);
CREATE TABLE IF NOT EXISTS images (
    id INTEGER PRIMARY KEY,
    hash TEXT NOT NULL UNIQUE,
    mime TEXT NOT NULL,
    data BLOB NOT NULL,
    created REAL NOT NULL
);
"""

STATUSES = ("complete", "streaming", "interrupted", "error", "cancelled")
SCHEMA_VERSION = 3  # 1: no reply versions, no model per conversation; 2: no images
# columns added since version 1: (table, column, definition); ALTER TABLE keeps every row
ADDED_COLUMNS = (
    ("conversations", "model", "TEXT NOT NULL DEFAULT ''"),
    ("messages", "versions", "TEXT NOT NULL DEFAULT '[]'"),
    ("messages", "version", "INTEGER NOT NULL DEFAULT 0"),
    ("messages", "images", "TEXT NOT NULL DEFAULT '[]'"),
)


class ConversationStore:
    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(str(path), isolation_level=None)  # autocommit; explicit transactions
        self.db.row_factory = sqlite3.Row
        self.db.text_factory = rows.decoded  # a row whose text is not UTF-8 reads, with U+FFFD, instead of raising
        try:
            with writing():  # a full disk is not a damaged file: NotSaved, never set aside as unreadable
                self.db.execute("PRAGMA journal_mode=WAL")
                self.db.execute("PRAGMA synchronous=NORMAL")
                self.db.execute("PRAGMA foreign_keys=ON")
                self.db.executescript(SCHEMA)
                self._migrate()
        except BaseException:
            self.db.close()
            raise
        try:
            self.recovered = self.mark_streaming_interrupted()
        except NotSaved:  # a full disk at start: those replies are marked at a later start
            self.recovered = 0

    def close(self) -> None:
        self.db.close()

    def _migrate(self) -> None:
        """Bring a database written by an older version up to :data:`SCHEMA_VERSION`, in place."""
        if self.db.execute("PRAGMA user_version").fetchone()[0] >= SCHEMA_VERSION:
            return
        self.db.execute("BEGIN IMMEDIATE")
        try:
            for table, column, definition in ADDED_COLUMNS:
                have = {r["name"] for r in self.db.execute(f"PRAGMA table_info({table})")}
                if column not in have:
                    self.db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {definition}")
            self.db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise

    # -- conversations ------------------------------------------------------
    def create(self, title: str = "New chat", system_prompt: str = "",
               settings: dict[str, Any] | None = None) -> Conversation:
        now = time.time()
        with writing():
            cur = self.db.execute(
                "INSERT INTO conversations(title, system_prompt, settings, created, updated) VALUES (?,?,?,?,?)",
                (storable(title), storable(system_prompt), json.dumps(settings or {}), now, now),
            )
        return self.get(int(cur.lastrowid or 0))

    def get(self, conversation_id: int) -> Conversation:
        row = self.db.execute("SELECT * FROM conversations WHERE id=?", (conversation_id,)).fetchone()
        if row is None:
            raise KeyError(conversation_id)
        return rows.conversation(row)

    def list(self, search: str = "") -> list[Conversation]:
        """Newest first; ``search`` matches titles and message text."""
        if search:
            like = f"%{storable(search)}%"
            found = self.db.execute(
                "SELECT DISTINCT c.* FROM conversations c LEFT JOIN messages m ON m.conversation_id = c.id "
                "WHERE c.title LIKE ? OR m.content LIKE ? ORDER BY c.updated DESC", (like, like)).fetchall()
        else:
            found = self.db.execute("SELECT * FROM conversations ORDER BY updated DESC").fetchall()
        return [rows.conversation(r) for r in found]

    def update(self, conversation_id: int, *, title: str | None = None, system_prompt: str | None = None,
               settings: dict[str, Any] | None = None, model: str | None = None) -> None:
        fields, values = ["updated=?"], [time.time()]
        if model is not None:
            fields.append("model=?")
            values.append(storable(model))
        if title is not None:
            fields.append("title=?")
            values.append(storable(title))
        if system_prompt is not None:
            fields.append("system_prompt=?")
            values.append(storable(system_prompt))
        if settings is not None:
            fields.append("settings=?")
            values.append(json.dumps(settings))
        with writing():
            self.db.execute(f"UPDATE conversations SET {', '.join(fields)} WHERE id=?", (*values, conversation_id))

    def delete(self, conversation_id: int) -> None:
        with transaction(self.db):
            self.db.execute("DELETE FROM conversations WHERE id=?", (conversation_id,))
            self._prune_images()

    # -- messages -------------------------------------------------------------
    def messages(self, conversation_id: int) -> list[Message]:
        found = self.db.execute("SELECT * FROM messages WHERE conversation_id=? ORDER BY id",
                                (conversation_id,)).fetchall()
        return [rows.message(r) for r in found]

    def add_message(self, conversation_id: int, role: str, content: str, status: str = "complete") -> Message:
        now = time.time()
        with writing():
            cur = self.db.execute(
                "INSERT INTO messages(conversation_id, role, content, status, created) VALUES (?,?,?,?,?)",
                (conversation_id, role, storable(content), status, now),
            )
            self.db.execute("UPDATE conversations SET updated=? WHERE id=?", (now, conversation_id))
        row = self.db.execute("SELECT * FROM messages WHERE id=?", (cur.lastrowid,)).fetchone()
        return rows.message(row)

    def update_message(self, message_id: int, *, content: str | None = None, status: str | None = None,
                       stats: dict[str, Any] | None = None) -> None:
        fields, values = [], []
        if content is not None:
            fields.append("content=?")
            values.append(storable(content))
        if status is not None:
            assert status in STATUSES, status
            fields.append("status=?")
            values.append(status)
        if stats is not None:
            fields.append("stats=?")
            values.append(json.dumps(stats))
        if fields:
            with writing():
                self.db.execute(f"UPDATE messages SET {', '.join(fields)} WHERE id=?", (*values, message_id))

    def add_turn(self, conversation_id: int, text: str, *, title: str | None = None,
                 images: tuple[Attachment, ...] = ()) -> tuple[Message, Message]:
        """The user's message (with its attached ``images``) and its empty ``streaming`` reply, written
        together (all or nothing).

        ``title``: the conversation's new title (its first message).

        Returns:
            The user's message and the reply's row.
        """
        now = time.time()
        with transaction(self.db):
            if title is not None:
                self.db.execute("UPDATE conversations SET title=? WHERE id=?", (storable(title), conversation_id))
            hashes = self._put_images(images)
            ids = [self.db.execute(
                "INSERT INTO messages(conversation_id, role, content, status, created, images) VALUES (?,?,?,?,?,?)",
                (conversation_id, role, content, status, now, json.dumps(attached))).lastrowid
                for role, content, status, attached in (("user", storable(text), "complete", hashes),
                                                        ("assistant", "", "streaming", []))]
            self.db.execute("UPDATE conversations SET updated=? WHERE id=?", (now, conversation_id))
        user, reply = (self.message(int(i or 0)) for i in ids)
        return user, reply

    def message(self, message_id: int) -> Message:
        row = self.db.execute("SELECT * FROM messages WHERE id=?", (message_id,)).fetchone()
        if row is None:
            raise KeyError(message_id)
        return rows.message(row)

    # -- versions and branches (app/chat/versions.py) --------------------------
    def new_version(self, message_id: int) -> Message:
        """Start another version of a reply (Regenerate), shown, empty and ``streaming``."""
        versions.new_version(self.db, message_id)
        return self.message(message_id)

    def select_version(self, message_id: int, index: int) -> Message:
        """Show version ``index`` of a message (clamped); a user message's comes with its branch."""
        versions.select_version(self.db, message_id, index)
        return self.message(message_id)

    def branch(self, message_id: int, text: str, *, title: str | None = None,
               images: tuple[Attachment, ...] = ()) -> tuple[Message, Message]:
        """Edit a user message: ``text`` (with ``images``) is its new version, with an empty ``streaming``
        reply; the version shown before keeps what followed it (``title``: the conversation's new title).

        Returns:
            The edited message and the reply's row.
        """
        with transaction(self.db):  # first: a refused edit leaves at most images nothing names (pruned later)
            hashes = self._put_images(images)
        reply = versions.branch(self.db, message_id, text, title, tuple(hashes))
        return self.message(message_id), self.message(reply)

    # -- images (app/chat/attachments.py) ------------------------------------------
    def image(self, image_hash: str) -> Attachment | None:
        """An attached image by its hash (None when the database does not hold it: a damaged row)."""
        row = self.db.execute("SELECT mime, data FROM images WHERE hash=?", (image_hash,)).fetchone()
        if row is None or not isinstance(row["data"], bytes):
            return None
        return Attachment(row["data"], rows.text_value(row["mime"]))

    def _put_images(self, images: tuple[Attachment, ...]) -> list[str]:
        """Store ``images`` (inside the caller's transaction); their hashes, in order."""
        now = time.time()
        for image in images:
            self.db.execute("INSERT OR IGNORE INTO images(hash, mime, data, created) VALUES (?,?,?,?)",
                            (image.hash, image.mime, image.data, now))
        return [image.hash for image in images]

    def _prune_images(self) -> None:
        """Drop the images no message names any more, in any version or branch (inside a transaction)."""
        named: set[str] = set()
        for r in self.db.execute("SELECT images, versions FROM messages WHERE images != '[]' OR versions != '[]'"):
            named.update(rows.image_hashes(r["images"]))
            _named_in(rows.json_value(r["versions"], list, []), named)
        if self.db.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='deleted_messages'").fetchone():
            for (kept,) in self.db.execute("SELECT row FROM deleted_messages"):  # an undo may bring them back
                record = rows.json_value(kept, dict, {})
                _named_in({**record, "versions": rows.json_value(record.get("versions"), list, [])}, named)
        for (image_hash,) in self.db.execute("SELECT hash FROM images").fetchall():
            if image_hash not in named:
                self.db.execute("DELETE FROM images WHERE hash=?", (image_hash,))

    def mark_streaming_interrupted(self) -> int:
        with writing():
            cur = self.db.execute("UPDATE messages SET status='interrupted' WHERE status='streaming'")
        return cur.rowcount

    # -- export (app/chat/export.py) ------------------------------------------
    def export_markdown(self, conversation_id: int) -> str:
        return export.markdown(self, conversation_id)

    def export_json(self, conversation_id: int) -> dict[str, Any]:
        return export.as_json(self, conversation_id)

    def export_text(self, conversation_id: int) -> str:
        return export.text(self, conversation_id)


def _named_in(value: object, named: set[str]) -> None:
    """Every image hash a stored version (and the branch it carries, at any depth) names."""
    if isinstance(value, list):
        for item in value:
            _named_in(item, named)
    elif isinstance(value, dict):
        named.update(rows.image_hashes(value.get("images")))
        for key in ("tail", "versions"):
            _named_in(value.get(key), named)
