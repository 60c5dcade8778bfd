"""What the conversation store writes and what the disk refuses.

Every write the disk cannot take (full, or failing) raises :class:`NotSaved`
(:class:`DiskFull` for a full one) instead of SQLite's own error, and leaves
the database as it was: the caller keeps what it meant to write and tries
again later (``app/chat/reply_saver.py``) or tells the user what was not done.

Text goes in through :func:`storable`: a Python ``str`` may hold lone UTF-16
surrogates (a paste, a ``\\udc80``-style escape in JSON) that SQLite's UTF-8 cannot
hold, and a message must never be lost for one odd character.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager


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


@contextmanager
def transaction(db: sqlite3.Connection) -> Iterator[None]:
    """Several writes as one: all of them, or (on :class:`NotSaved` or any error) none."""
    with writing():
        db.execute("BEGIN IMMEDIATE")
        try:
            yield
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise


def storable(text: str) -> str:
    """``text`` as UTF-8 can hold it: surrogate pairs joined, lone surrogates
    replaced by U+FFFD. Valid text (nearly always) is returned as it is."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text
