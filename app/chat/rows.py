"""The store's rows as Python reads them: frozen :class:`Conversation` and
:class:`Message`, decoded so that a damaged or hand-edited row spoils its own
field, never the list it is in nor the app's start.

Text comes out through :func:`decoded`: bytes that are not UTF-8 in a row
(written by another tool, or by hand) read as U+FFFD instead of raising.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from typing import Any

from app.chat.disk import storable

VERSION_KEYS = {"content", "status", "stats", "created"}  # what every stored version holds


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
    version: int = 0  # which of the message's versions is shown (0-based): a reply's regenerations, an edit's branches
    version_count: int = 1
    images: tuple[str, ...] = ()  # attached images (the store's ``images`` table, by content hash), in order


def decoded(raw: bytes) -> str:
    """A TEXT value as Python reads it: UTF-8, each byte that is not UTF-8 read as U+FFFD (a hand-edited or
    foreign-written row; SQLite stores whatever bytes it is given)."""
    return raw.decode("utf-8", "replace")


def json_value(text: object, kind: type, default: Any) -> Any:
    """A JSON column's value, or ``default`` when it is not JSON of that kind."""
    try:
        value = json.loads(text) if isinstance(text, str | bytes) else None
    except (ValueError, RecursionError):
        return default
    return value if isinstance(value, kind) else default


def text_value(value: object) -> str:
    """A text column as text, whatever a damaged or hand-edited row holds there."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return "" if value is None else storable(str(value))


def image_hashes(value: object) -> list[str]:
    """A message's (or a stored version's) attached images: their content hashes, whatever a damaged row holds."""
    found = json_value(value, list, []) if not isinstance(value, list) else value
    return [h for h in found if isinstance(h, str) and h]


def shown_index(r: sqlite3.Row) -> int:
    return r["version"] if isinstance(r["version"], int) else 0


def conversation(r: sqlite3.Row) -> Conversation:
    return Conversation(r["id"], text_value(r["title"]), text_value(r["system_prompt"]),
                        json_value(r["settings"], dict, {}), r["created"], r["updated"], text_value(r["model"]))


def message(r: sqlite3.Row) -> Message:
    count = len(stored_versions(r)) or 1
    return Message(r["id"], r["conversation_id"], text_value(r["role"]), text_value(r["content"]),
                   text_value(r["status"]), json_value(r["stats"], dict, None), r["created"], shown_index(r), count,
                   tuple(image_hashes(r["images"])))


def stored_versions(r: sqlite3.Row) -> list[dict[str, Any]]:
    versions = json_value(r["versions"], list, [])
    return versions if all(isinstance(v, dict) and VERSION_KEYS <= v.keys() for v in versions) else []


def versions(r: sqlite3.Row) -> list[dict[str, Any]]:
    """Every version of a message, the shown one as the row holds it now (it may have streamed on since)."""
    shown = {"content": text_value(r["content"]), "status": text_value(r["status"]),
             "stats": json_value(r["stats"], dict, None), "created": r["created"], "images": image_hashes(r["images"])}
    every = stored_versions(r) or [shown]
    every[max(0, min(shown_index(r), len(every) - 1))] = shown
    return every


def as_record(r: sqlite3.Row) -> dict[str, Any]:
    """A message row as JSON keeps it inside an edited message's version (the branch below it)."""
    return {"role": text_value(r["role"]), "content": text_value(r["content"]), "status": text_value(r["status"]),
            "stats": json_value(r["stats"], dict, None), "created": r["created"],
            "versions": stored_versions(r), "version": shown_index(r), "images": image_hashes(r["images"])}
