"""Moving an unreadable file out of the way under a name no later one takes.

A file the app cannot read (settings, the conversations database) is kept,
never deleted, so the user can look at it or send it in. The name carries
the time and, when two bad files meet in one second, a counter: a second
bad file never overwrites the first.
"""

from __future__ import annotations

import os
import time
from pathlib import Path


def aside_name(path: Path, now: float | None = None) -> Path:
    """``settings.json`` → ``settings.unreadable-20261130-101500.json`` (``-2``, ``-3`` … if taken)."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(time.time() if now is None else now))
    base = f"{path.stem}.unreadable-{stamp}"
    candidate = path.with_name(base + path.suffix)
    n = 2
    while candidate.exists() or candidate.with_name(candidate.name + "-wal").exists():
        candidate = path.with_name(f"{base}-{n}{path.suffix}")
        n += 1
    return candidate


def set_aside(path: Path, companions: tuple[str, ...] = ()) -> Path:
    """Rename ``path`` (and ``path + suffix`` for each companion that exists: ``-wal``, ``-shm``) aside.

    Returns:
        Where ``path`` went.

    Raises:
        OSError: it could not be renamed (a read-only folder); nothing was moved.
    """
    target = aside_name(path)
    os.replace(path, target)  # only on this folder's file system: a rename, never a copy
    for suffix in companions:
        extra = path.with_name(path.name + suffix)
        if extra.exists():
            try:
                os.replace(extra, target.with_name(target.name + suffix))
            except OSError:
                pass  # the main file is what matters; a stray -shm is rebuilt by SQLite
    return target
