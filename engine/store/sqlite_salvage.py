"""Reading what survives of a damaged SQLite file, whatever its schema.

Two ways in, for the app's conversations database (``app/store_rescue.py``)
and any other: ``sqlite3 FILE .recover``, the command-line tool's reader that
walks every page, where that tool is installed; and a copy padded to the
length its header states, which Python's own driver can then read page by
page. Here, not in the app, because it starts a child process and knows no
Qt.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

RECOVER_TIMEOUT_S = 120.0  # .recover reads every page; a few hundred MB take seconds


def padded_copy(damaged: Path, out: Path) -> Path:
    """A copy of ``damaged`` as long as its header says it is, the missing pages zeros.

    SQLite refuses the whole schema of a file shorter than its header's page
    count ("database disk image is malformed"); with the missing pages there
    as zeros, every page that survived can be read. The copy is extended
    sparsely, and never past four times the file's own size.
    """
    shutil.copyfile(damaged, out)
    size = out.stat().st_size
    with out.open("r+b") as f:
        header = f.read(100)
        if len(header) < 32 or not header.startswith(b"SQLite format 3\0"):
            return out
        page_size = int.from_bytes(header[16:18], "big")
        page_size = 65536 if page_size == 1 else page_size
        wanted = page_size * int.from_bytes(header[28:32], "big")
        if size < wanted <= 4 * size + (1 << 20):
            f.truncate(wanted)
    return out


def recover_with_cli(damaged: Path, out: Path) -> Path | None:
    """``sqlite3 damaged .recover | sqlite3 out``; None when there is no such command or it failed."""
    cli = shutil.which("sqlite3")
    if cli is None:
        return None
    try:
        dump = subprocess.run([cli, str(damaged), ".recover"], capture_output=True, timeout=RECOVER_TIMEOUT_S,
                              check=False, stdin=subprocess.DEVNULL).stdout
        # the second sqlite3 goes on past a statement that fails (no -bail): every row it can take
        subprocess.run([cli, str(out)], input=dump, capture_output=True, timeout=RECOVER_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out if out.exists() else None
