"""Conversations on disk: SQLite in WAL mode in the data folder.

A reply is written while it streams (status ``streaming``), so a killed app
or worker loses at most the last fraction of a second; on the next start,
or when the worker dies, such a reply is marked ``interrupted`` and kept.
No Qt here: the store is plain Python and tested as such.

Regenerate does not overwrite a reply: the earlier versions are kept with it
(``‹1/2›`` in the transcript). The message row always holds the version on
show, so history, search and export read one row per message as before; the
others live in its ``versions`` column (JSON), and the row is copied back
there before another version is shown. Older databases gain the new columns
when opened (:meth:`ConversationStore._migrate`); nothing is rewritten.

Text goes in through :func:`storable`: a Python ``str`` may hold lone UTF-16
surrogates (a paste, a ``\\udc80``-style escape in JSON) that SQLite's UTF-8 cannot
hold, and a message must never be lost for one odd character.
Text comes out through :func:`_decoded`: bytes that are not UTF-8 in a row
(written by another tool, or by hand) read as U+FFFD instead of raising.

Every write the disk cannot take (full, or failing) raises :class:`NotSaved`
(:class:`DiskFull` for a full one) instead of SQLite's own error, and leaves
the database as it was: the caller keeps what it meant to write and tries
again later (``app/chat/reply_saver.py``) or tells the user what was not done.
A turn's two rows (the message and its empty reply, after what an edit
replaces) are written in one transaction, so a full disk never leaves a
message without its reply row or an edit half done.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
    version INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS messages_by_conversation ON messages(conversation_id, id);
"""

STATUSES = ("complete", "streaming", "interrupted", "error", "cancelled")
SCHEMA_VERSION = 2  # 1: no reply versions, no model per conversation
# columns added since version 1: (table, column, definition); ALTER TABLE keeps every row
ADDED_COLUMNS = (
    ("conversations", "model", "TEXT NOT NULL DEFAULT ''"),
    ("messages", "versions", "TEXT NOT NULL DEFAULT '[]'"),
    ("messages", "version", "INTEGER NOT NULL DEFAULT 0"),
)


class NotSaved(OSError):
    """A write did not reach the disk; the database is as it was before it."""


class DiskFull(NotSaved):
    """The disk (or the quota) has no room for the write."""


@contextmanager
def writing() -> Iterator[None]:
    """Translate SQLite's errors for a write the disk refused into :class:`NotSaved`.

    SQLite rolls the statement back itself, so nothing half-written is left and
    the same write can simply be made again once there is room."""
    try:
        yield
    except sqlite3.OperationalError as exc:
        code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
        if code == sqlite3.SQLITE_FULL:
            raise DiskFull(f"the disk is full ({exc})") from exc
        if code == sqlite3.SQLITE_IOERR:
            raise NotSaved(f"the disk could not be written ({exc})") from exc
        raise


def storable(text: str) -> str:
    """``text`` as UTF-8 can hold it: surrogate pairs joined, lone surrogates
    replaced by U+FFFD. Valid text (nearly always) is returned as it is."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


@dataclass(frozen=True)
class Conversation:
    id: int
    title: str
    system_prompt: str
    settings: dict[str, Any]
    created: float
    updated: float
    model: str = ""  # the model of its last reply ("" before the first)


@dataclass(frozen=True)
class Message:
    id: int
    conversation_id: int
    role: str
    content: str
    status: str
    stats: dict[str, Any] | None
    created: float
    version: int = 0  # which of the reply's versions is shown (0-based)
    version_count: int = 1


class ConversationStore:
    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(str(path), isolation_level=None)  # autocommit; explicit transactions
        self.db.row_factory = sqlite3.Row
        self.db.text_factory = _decoded  # a row whose text is not UTF-8 reads, with U+FFFD, instead of raising
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

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        """Several writes as one: all of them, or (on :class:`NotSaved` or any error) none."""
        with writing():
            self.db.execute("BEGIN IMMEDIATE")
            try:
                yield
                self.db.execute("COMMIT")
            except BaseException:
                if self.db.in_transaction:
                    self.db.execute("ROLLBACK")
                raise

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
        return _conversation(row)

    def list(self, search: str = "") -> list[Conversation]:
        """Newest first; ``search`` matches titles and message text."""
        if search:
            like = f"%{storable(search)}%"
            rows = self.db.execute(
                "SELECT DISTINCT c.* FROM conversations c LEFT JOIN messages m ON m.conversation_id = c.id "
                "WHERE c.title LIKE ? OR m.content LIKE ? ORDER BY c.updated DESC", (like, like)).fetchall()
        else:
            rows = self.db.execute("SELECT * FROM conversations ORDER BY updated DESC").fetchall()
        return [_conversation(r) for r in rows]

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
        with writing():
            self.db.execute("DELETE FROM conversations WHERE id=?", (conversation_id,))

    # -- messages -------------------------------------------------------------
    def messages(self, conversation_id: int) -> list[Message]:
        rows = self.db.execute("SELECT * FROM messages WHERE conversation_id=? ORDER BY id",
                               (conversation_id,)).fetchall()
        return [_message(r) for r in rows]

    def add_message(self, conversation_id: int, role: str, content: str, status: str = "complete") -> Message:
        now = time.time()
        with writing():
            cur = self.db.execute(
                "INSERT INTO messages(conversation_id, role, content, status, created) VALUES (?,?,?,?,?)",
                (conversation_id, role, storable(content), status, now),
            )
            self.db.execute("UPDATE conversations SET updated=? WHERE id=?", (now, conversation_id))
        row = self.db.execute("SELECT * FROM messages WHERE id=?", (cur.lastrowid,)).fetchone()
        return _message(row)

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
                 replace_from: int | None = None) -> tuple[Message, Message]:
        """The user's message and its empty ``streaming`` reply, written together (both or neither).

        ``title``: the conversation's new title (its first message); ``replace_from``: an edit,
        that message and everything after it deleted in the same transaction.

        Returns:
            The user's message and the reply's row.
        """
        now = time.time()
        with self._transaction():
            if replace_from is not None:
                self.db.execute("DELETE FROM messages WHERE conversation_id=? AND id>=?",
                                (conversation_id, replace_from))
            if title is not None:
                self.db.execute("UPDATE conversations SET title=? WHERE id=?", (storable(title), conversation_id))
            ids = [self.db.execute(
                "INSERT INTO messages(conversation_id, role, content, status, created) VALUES (?,?,?,?,?)",
                (conversation_id, role, content, status, now)).lastrowid
                for role, content, status in (("user", storable(text), "complete"), ("assistant", "", "streaming"))]
            self.db.execute("UPDATE conversations SET updated=? WHERE id=?", (now, conversation_id))
        user, reply = (self.message(int(i or 0)) for i in ids)
        return user, reply

    def message(self, message_id: int) -> Message:
        row = self.db.execute("SELECT * FROM messages WHERE id=?", (message_id,)).fetchone()
        if row is None:
            raise KeyError(message_id)
        return _message(row)

    def new_version(self, message_id: int) -> Message:
        """Start another version of a reply (Regenerate): the shown one is kept (unless it is
        empty), an empty ``streaming`` one is shown, and the reply streams into this same message."""
        row = self.db.execute("SELECT * FROM messages WHERE id=?", (message_id,)).fetchone()
        if row is None:
            raise KeyError(message_id)
        now = time.time()
        versions = _versions(row)
        if not row["content"]:  # nothing came (an error, an empty stop): nothing worth keeping
            versions.pop(min(row["version"], len(versions) - 1))
        versions.append({"content": "", "status": "streaming", "stats": None, "created": now})
        with writing():
            self.db.execute("UPDATE messages SET content='', status='streaming', stats=NULL, created=?, versions=?, "
                            "version=? WHERE id=?", (now, json.dumps(versions), len(versions) - 1, message_id))
        return self.message(message_id)

    def select_version(self, message_id: int, index: int) -> Message:
        """Show version ``index`` of a reply (clamped to the versions there are)."""
        row = self.db.execute("SELECT * FROM messages WHERE id=?", (message_id,)).fetchone()
        if row is None:
            raise KeyError(message_id)
        versions = _versions(row)
        index = max(0, min(index, len(versions) - 1))
        chosen = versions[index]
        stats = json.dumps(chosen["stats"]) if chosen.get("stats") is not None else None
        with writing():
            self.db.execute("UPDATE messages SET content=?, status=?, stats=?, created=?, versions=?, version=? "
                            "WHERE id=?", (chosen["content"], chosen["status"], stats, chosen["created"],
                                           json.dumps(versions) if len(versions) > 1 else "[]", index, message_id))
        return self.message(message_id)

    def mark_streaming_interrupted(self) -> int:
        with writing():
            cur = self.db.execute("UPDATE messages SET status='interrupted' WHERE status='streaming'")
        return cur.rowcount

    # -- export -------------------------------------------------------------
    def export_markdown(self, conversation_id: int) -> str:
        conv = self.get(conversation_id)
        lines = [f"# {conv.title}", ""]
        if conv.system_prompt:
            lines += [f"> System: {conv.system_prompt}", ""]
        for m in self.messages(conversation_id):
            note = "" if m.status == "complete" else f" _({m.status})_"
            lines += [f"**{m.role.capitalize()}**{note}", "", m.content, ""]
        return "\n".join(lines)

    def export_json(self, conversation_id: int) -> dict[str, Any]:
        conv = self.get(conversation_id)
        return {
            "title": conv.title, "system_prompt": conv.system_prompt, "settings": conv.settings,
            "created": conv.created,
            "model": conv.model,
            "messages": [self._exported(m) for m in self.messages(conversation_id)],
        }

    def _exported(self, m: Message) -> dict[str, Any]:
        out: dict[str, Any] = {"role": m.role, "content": m.content, "status": m.status, "stats": m.stats,
                               "created": m.created}
        if m.version_count > 1:  # every version, the shown one marked
            row = self.db.execute("SELECT * FROM messages WHERE id=?", (m.id,)).fetchone()
            out["versions"], out["version"] = _versions(row), m.version
        return out

    def export_text(self, conversation_id: int) -> str:
        """Plain text: who said what, for pasting anywhere."""
        conv = self.get(conversation_id)
        lines = [conv.title, "=" * len(conv.title), ""]
        if conv.system_prompt:
            lines += [f"System: {conv.system_prompt}", ""]
        names = {"user": "You", "assistant": "Assistant", "system": "System"}
        for m in self.messages(conversation_id):
            note = "" if m.status == "complete" else f" ({m.status})"
            lines += [f"{names.get(m.role, m.role)}{note}:", m.content, ""]
        return "\n".join(lines)


def _decoded(raw: bytes) -> str:
    """A TEXT value as Python reads it: UTF-8, each byte that is not UTF-8 read as U+FFFD (a hand-edited or
    foreign-written row; SQLite stores whatever bytes it is given)."""
    return raw.decode("utf-8", "replace")


def _json(text: object, kind: type, default: Any) -> Any:
    """A JSON column's value, or ``default`` when it is not JSON of that kind: a damaged
    value spoils its own field, never the list it is in nor the app's start."""
    try:
        value = json.loads(text) if isinstance(text, str | bytes) else None
    except (ValueError, RecursionError):
        return default
    return value if isinstance(value, kind) else default


def _text(value: object) -> str:
    """A text column as text, whatever a damaged or hand-edited row holds there."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return "" if value is None else storable(str(value))


def _conversation(r: sqlite3.Row) -> Conversation:
    return Conversation(r["id"], _text(r["title"]), _text(r["system_prompt"]), _json(r["settings"], dict, {}),
                        r["created"], r["updated"], _text(r["model"]))


def _message(r: sqlite3.Row) -> Message:
    count = len(_stored_versions(r)) or 1
    return Message(r["id"], r["conversation_id"], _text(r["role"]), _text(r["content"]), _text(r["status"]),
                   _json(r["stats"], dict, None), r["created"], r["version"] if isinstance(r["version"], int) else 0,
                   count)


def _stored_versions(r: sqlite3.Row) -> list[dict[str, Any]]:
    versions = _json(r["versions"], list, [])
    keys = {"content", "status", "stats", "created"}
    return versions if all(isinstance(v, dict) and keys <= v.keys() for v in versions) else []


def _versions(r: sqlite3.Row) -> list[dict[str, Any]]:
    """Every version of a reply, the shown one as the row holds it now (it may have streamed on since)."""
    shown = {"content": _text(r["content"]), "status": _text(r["status"]), "stats": _json(r["stats"], dict, None),
             "created": r["created"]}
    versions = _stored_versions(r) or [shown]
    index = r["version"] if isinstance(r["version"], int) else 0
    versions[max(0, min(index, len(versions) - 1))] = shown
    return versions
