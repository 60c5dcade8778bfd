"""Conversations on disk: SQLite in WAL mode in the data folder.

A reply is written while it streams (status ``streaming``), so a killed app
or worker loses at most the last fraction of a second; on the next start,
or when the worker dies, such a reply is marked ``interrupted`` and kept.
No Qt here: the store is plain Python and tested as such.

Text goes in through :func:`storable`: a Python ``str`` may hold lone UTF-16
surrogates (a paste, a ``\\udXXX`` escape in JSON) that SQLite's UTF-8 cannot
hold, and a message must never be lost for one odd character.
"""

from __future__ import annotations

import json
import sqlite3
import time
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
    updated REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY,
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    status TEXT NOT NULL DEFAULT 'complete',
    stats TEXT,
    created REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS messages_by_conversation ON messages(conversation_id, id);
"""

STATUSES = ("complete", "streaming", "interrupted", "error", "cancelled")


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


@dataclass(frozen=True)
class Message:
    id: int
    conversation_id: int
    role: str
    content: str
    status: str
    stats: dict[str, Any] | None
    created: float


class ConversationStore:
    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(str(path), isolation_level=None)  # autocommit; explicit transactions
        self.db.row_factory = sqlite3.Row
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute("PRAGMA foreign_keys=ON")
        self.db.executescript(SCHEMA)
        self.recovered = self.mark_streaming_interrupted()

    def close(self) -> None:
        self.db.close()

    # -- conversations ------------------------------------------------------
    def create(self, title: str = "New chat", system_prompt: str = "",
               settings: dict[str, Any] | None = None) -> Conversation:
        now = time.time()
        cur = self.db.execute(
            "INSERT INTO conversations(title, system_prompt, settings, created, updated) VALUES (?,?,?,?,?)",
            (storable(title), storable(system_prompt), json.dumps(settings or {}), now, now),
        )
        return self.get(int(cur.lastrowid or 0))

    def get(self, conversation_id: int) -> Conversation:
        row = self.db.execute("SELECT * FROM conversations WHERE id=?", (conversation_id,)).fetchone()
        if row is None:
            raise KeyError(conversation_id)
        return Conversation(row["id"], row["title"], row["system_prompt"], json.loads(row["settings"]),
                            row["created"], row["updated"])

    def list(self, search: str = "") -> list[Conversation]:
        """Newest first; ``search`` matches titles and message text."""
        if search:
            like = f"%{storable(search)}%"
            rows = self.db.execute(
                "SELECT DISTINCT c.* FROM conversations c LEFT JOIN messages m ON m.conversation_id = c.id "
                "WHERE c.title LIKE ? OR m.content LIKE ? ORDER BY c.updated DESC", (like, like)).fetchall()
        else:
            rows = self.db.execute("SELECT * FROM conversations ORDER BY updated DESC").fetchall()
        return [Conversation(r["id"], r["title"], r["system_prompt"], json.loads(r["settings"]),
                             r["created"], r["updated"]) for r in rows]

    def update(self, conversation_id: int, *, title: str | None = None, system_prompt: str | None = None,
               settings: dict[str, Any] | None = None) -> None:
        fields, values = ["updated=?"], [time.time()]
        if title is not None:
            fields.append("title=?")
            values.append(storable(title))
        if system_prompt is not None:
            fields.append("system_prompt=?")
            values.append(storable(system_prompt))
        if settings is not None:
            fields.append("settings=?")
            values.append(json.dumps(settings))
        self.db.execute(f"UPDATE conversations SET {', '.join(fields)} WHERE id=?", (*values, conversation_id))

    def delete(self, conversation_id: int) -> None:
        self.db.execute("DELETE FROM conversations WHERE id=?", (conversation_id,))

    # -- messages -------------------------------------------------------------
    def messages(self, conversation_id: int) -> list[Message]:
        rows = self.db.execute("SELECT * FROM messages WHERE conversation_id=? ORDER BY id",
                               (conversation_id,)).fetchall()
        return [_message(r) for r in rows]

    def add_message(self, conversation_id: int, role: str, content: str, status: str = "complete") -> Message:
        now = time.time()
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
            self.db.execute(f"UPDATE messages SET {', '.join(fields)} WHERE id=?", (*values, message_id))

    def delete_from(self, conversation_id: int, message_id: int) -> None:
        """Delete ``message_id`` and everything after it (regenerate, edit and resend)."""
        self.db.execute("DELETE FROM messages WHERE conversation_id=? AND id>=?", (conversation_id, message_id))

    def mark_streaming_interrupted(self) -> int:
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
            "messages": [{"role": m.role, "content": m.content, "status": m.status, "stats": m.stats,
                          "created": m.created} for m in self.messages(conversation_id)],
        }


def _message(r: sqlite3.Row) -> Message:
    return Message(r["id"], r["conversation_id"], r["role"], r["content"], r["status"],
                   json.loads(r["stats"]) if r["stats"] else None, r["created"])
