"""Versions of a message, kept in its row: a reply's regenerations and an edited message's branches.

Regenerate does not overwrite a reply: the earlier versions are kept with it
(``‹1/2›`` in the transcript). An edit does not delete the message it edits
nor what followed it: the edited text becomes another version of that message,
and each version of a user message keeps its own branch, the messages that
followed it (``‹1/2›`` on the user message switches the whole branch below).

The message row always holds the version on show, and the rows after an
edited message are the shown version's branch, so history, search and export
read one row per message on the shown path, as before. The other versions
live in the row's ``versions`` column (JSON); a version that is not shown
carries its branch there (``"tail"``: the rows after it, each with its own
versions). Switching copies the shown branch into its version and writes the
chosen branch back as rows, in one transaction: a full disk leaves it as it was.
A chat's title made from its first message follows the version of it shown.
"""

from __future__ import annotations

import json
import sqlite3
import time
from typing import Any

from app.chat import rows
from app.chat.disk import storable, transaction, writing
from app.chat.titles import title_from


def _row(db: sqlite3.Connection, message_id: int) -> sqlite3.Row:
    row = db.execute("SELECT * FROM messages WHERE id=?", (message_id,)).fetchone()
    if row is None:
        raise KeyError(message_id)
    return row


def new_version(db: sqlite3.Connection, message_id: int) -> None:
    """Start another version of a reply (Regenerate): the shown one is kept (unless it is
    empty), an empty ``streaming`` one is shown, and the reply streams into this same message."""
    row = _row(db, message_id)
    now = time.time()
    every = rows.versions(row)
    if not row["content"]:  # nothing came (an error, an empty stop): nothing worth keeping
        every.pop(min(rows.shown_index(row), len(every) - 1))
    every.append({"content": "", "status": "streaming", "stats": None, "created": now})
    with writing():
        db.execute("UPDATE messages SET content='', status='streaming', stats=NULL, created=?, versions=?, "
                   "version=? WHERE id=?", (now, json.dumps(every), len(every) - 1, message_id))


def select_version(db: sqlite3.Connection, message_id: int, index: int) -> None:
    """Show version ``index`` of a message (clamped to the versions there are); for a user
    message, with the branch that followed that version."""
    row = _row(db, message_id)
    every = rows.versions(row)
    index = max(0, min(index, len(every) - 1))
    shown = min(rows.shown_index(row), len(every) - 1)
    with transaction(db):
        if rows.text_value(row["role"]) == "user" and index != shown:
            every[shown]["tail"] = _take_tail(db, row)
            _put_tail(db, row["conversation_id"], every[index].pop("tail", []))
            _follow_title(db, row, every[shown]["content"], every[index]["content"])
        chosen = every[index]
        stats = json.dumps(chosen["stats"]) if chosen.get("stats") is not None else None
        db.execute("UPDATE messages SET content=?, status=?, stats=?, created=?, versions=?, version=?, images=? "
                   "WHERE id=?", (chosen["content"], chosen["status"], stats, chosen["created"],
                                  json.dumps(every) if len(every) > 1 else "[]", index,
                                  json.dumps(rows.image_hashes(chosen.get("images"))), message_id))


def branch(db: sqlite3.Connection, message_id: int, text: str, title: str | None,
           images: tuple[str, ...] = ()) -> int:
    """Edit a user message: ``text`` (with the attached ``images``, by hash, already stored) becomes its
    newest version, shown, with an empty ``streaming`` reply; the version shown before keeps its branch
    and its images. One transaction.

    Returns:
        The new reply's id.
    """
    row = _row(db, message_id)
    now = time.time()
    every = rows.versions(row)
    conversation_id = row["conversation_id"]
    with transaction(db):
        every[min(rows.shown_index(row), len(every) - 1)]["tail"] = _take_tail(db, row)
        every.append({"content": storable(text), "status": "complete", "stats": None, "created": now,
                      "images": list(images)})
        db.execute("UPDATE messages SET content=?, status='complete', stats=NULL, created=?, versions=?, version=?, "
                   "images=? WHERE id=?", (storable(text), now, json.dumps(every), len(every) - 1,
                                           json.dumps(list(images)), message_id))
        reply = db.execute("INSERT INTO messages(conversation_id, role, content, status, created) "
                           "VALUES (?, 'assistant', '', 'streaming', ?)", (conversation_id, now)).lastrowid
        if title is not None:
            db.execute("UPDATE conversations SET title=? WHERE id=?", (storable(title), conversation_id))
        db.execute("UPDATE conversations SET updated=? WHERE id=?", (now, conversation_id))
    return int(reply or 0)


def _follow_title(db: sqlite3.Connection, row: sqlite3.Row, before: str, after: str) -> None:
    """A title made from the first message follows the version of it shown (its branch); one the user gave stays."""
    first = db.execute("SELECT MIN(id) FROM messages WHERE conversation_id=?", (row["conversation_id"],)).fetchone()
    if first is None or first[0] != row["id"]:
        return
    made, shown = (storable(title_from(text or "Image")) for text in (before, after))
    db.execute("UPDATE conversations SET title=? WHERE id=? AND title=?", (shown, row["conversation_id"], made))


def _take_tail(db: sqlite3.Connection, row: sqlite3.Row) -> list[dict[str, Any]]:
    """The rows after ``row`` in its conversation, as records, removed from the table (inside a transaction)."""
    after = db.execute("SELECT * FROM messages WHERE conversation_id=? AND id>? ORDER BY id",
                       (row["conversation_id"], row["id"])).fetchall()
    db.execute("DELETE FROM messages WHERE conversation_id=? AND id>?", (row["conversation_id"], row["id"]))
    return [rows.as_record(r) for r in after]


def _put_tail(db: sqlite3.Connection, conversation_id: int, tail: object) -> None:
    """Write a branch's records back as rows (new ids, in order, after every row there is)."""
    for record in tail if isinstance(tail, list) else []:
        if not isinstance(record, dict) or not rows.VERSION_KEYS <= record.keys():
            continue  # a damaged record spoils itself, never the branch
        stats = record.get("stats")
        db.execute("INSERT INTO messages(conversation_id, role, content, status, stats, created, versions, version, "
                   "images) VALUES (?,?,?,?,?,?,?,?,?)",
                   (conversation_id, rows.text_value(record.get("role", "user")), rows.text_value(record["content"]),
                    rows.text_value(record["status"]), json.dumps(stats) if isinstance(stats, dict) else None,
                    record["created"] if isinstance(record["created"], int | float) else time.time(),
                    json.dumps(record.get("versions") or []),
                    record.get("version") if isinstance(record.get("version"), int) else 0,
                    json.dumps(rows.image_hashes(record.get("images")))))
