"""Opening the conversations database when it may be damaged.

A database SQLite cannot open or check (random bytes, a truncated file, a
zeroed header) must not stop the app: it is set aside under a name of its
own (``conversations.unreadable-<time>.sqlite3``, never overwritten), a new
one is started, and what rows can be read are copied into it — through the
``sqlite3`` command's ``.recover`` where that command exists, which reads
past broken pages, and row by row with Python's driver for what it missed. The caller gets a
notice that says where the old file went and how much came back.

No Qt here, like the store itself.
"""

from __future__ import annotations

import sqlite3
import tempfile
from collections.abc import Iterator
from pathlib import Path

from app.chat.rows import decoded
from app.chat.store import ConversationStore, writing
from app.set_aside import set_aside
from engine.store.sqlite_salvage import padded_copy, recover_with_cli

TABLES = ("conversations", "messages", "images")  # parents first: a message needs its conversation
MAX_SKIPS = 1000  # unreadable rows jumped over in one table before the rest of it is given up


def open_store(path: Path) -> tuple[ConversationStore, list[str]]:
    """The store at ``path``, and what the user should be told (empty when the file was sound)."""
    problem = _problem(path)
    if problem is None:
        try:
            return ConversationStore(path), []
        except sqlite3.DatabaseError as exc:  # opened and checked, yet the schema cannot be used
            problem = str(exc)
    try:
        kept = set_aside(path, ("-wal", "-shm"))
    except OSError as exc:
        store = ConversationStore(Path(":memory:"))
        return store, [f"The conversations database {path} is damaged ({problem}) and could not be moved "
                       f"aside ({exc.strerror}). Conversations of this session will not be saved; move the "
                       "file away and restart."]
    store = ConversationStore(path)
    conversations, messages = salvage(kept, store)
    found = (f"{conversations} conversation(s) and {messages} message(s) were recovered from it"
             if conversations or messages else "nothing could be recovered from it")
    return store, [f"The conversations database could not be opened ({problem}). It was kept as {kept}, "
                   f"a new one was started, and {found}."]


def _problem(path: Path) -> str | None:
    """Why SQLite cannot use the file (None: it can, or there is none yet)."""
    if not path.exists():
        return None
    try:
        db = sqlite3.connect(str(path))
    except sqlite3.Error as exc:
        return str(exc)
    try:
        with writing():  # reading a WAL database writes its index: a full disk raises NotSaved, not damage
            result = db.execute("PRAGMA quick_check(1)").fetchone()[0]
        return None if result == "ok" else f"database disk image is malformed: {result}"
    except sqlite3.Error as exc:
        return str(exc)
    finally:
        db.close()


def salvage(damaged: Path, store: ConversationStore) -> tuple[int, int]:
    """Copy the conversations and messages that can be read from ``damaged`` into ``store``.

    Returns:
        How many conversations and messages were copied.
    """
    counts = [0] * len(TABLES)
    with tempfile.TemporaryDirectory(prefix="mtp-studio-recover-") as tmp:
        recovered = recover_with_cli(damaged, Path(tmp) / "recovered.sqlite3")
        # .recover first (it reads past broken pages), then the file itself for what .recover missed:
        # some builds' .recover gives nothing (Debian's 3.40.1: "SQL logic error"); a row already
        # copied is refused by its id
        for source in (recovered, padded_copy(damaged, Path(tmp) / "padded.sqlite3")):
            if source is None:
                continue
            try:
                db = sqlite3.connect(f"file:{source}?mode=ro&immutable=1", uri=True)
            except sqlite3.Error:
                continue
            # as the store reads: text that is not UTF-8 comes back with U+FFFD (the default decoding
            # raises, and the row, taken for an unreadable page, was lost)
            db.text_factory = decoded
            try:
                for i, table in enumerate(TABLES):
                    counts[i] += _copy_table(db, store, table)
            finally:
                db.close()
    return counts[0], counts[1]


def _copy_table(source: sqlite3.Connection, store: ConversationStore, table: str) -> int:
    """Copy the rows of ``table`` the store's schema can take; a row it refuses is left out alone."""
    try:
        have = {r[1] for r in source.execute(f"PRAGMA table_info({table})")}
    except sqlite3.Error:
        return 0
    want = [r["name"] for r in store.db.execute(f"PRAGMA table_info({table})")]
    columns = [c for c in want if c in have]
    if "id" not in columns:
        return 0
    insert = f"INSERT INTO {table}({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"
    copied = 0
    store.db.execute("BEGIN")
    try:
        for row in _readable_rows(source, table, columns):
            try:
                store.db.execute(insert, row)
                copied += 1
            except sqlite3.Error:  # NULL where the schema wants a value, a message without its conversation
                pass
        store.db.execute("COMMIT")
    except BaseException:
        store.db.execute("ROLLBACK")
        raise
    return copied


def _readable_rows(db: sqlite3.Connection, table: str, columns: list[str]) -> Iterator[tuple[object, ...]]:
    """Rows in id order; a page that cannot be read is jumped over, up to :data:`MAX_SKIPS` times."""
    query = f"SELECT {', '.join(columns)} FROM {table} WHERE id > ? ORDER BY id"
    after, skips = -(2**63), 0
    while skips <= MAX_SKIPS:
        try:
            for row in db.execute(query, (after,)):
                after = row[columns.index("id")]
                yield tuple(row)
            return
        except sqlite3.Error:
            skips += 1
            after += 1  # past the row that failed, or at least one id further
