"""Resumable, verified downloads of GGUF files from the Hugging Face hub.

huggingface_hub (≥ 1.18) deletes a partial file when a download fails, so a
download killed at 50% would start over. This module keeps its own partial
file instead, using huggingface_hub for what it is good at (URLs, auth,
the LFS metadata):

1. ``get_hf_file_metadata`` gives the size and, for LFS files, the sha256
   (the ETag of an LFS object is its sha256; a non-LFS file's ETag is a git
   sha1, so for those the size is all there is to check).
2. One download of a file at a time: an OS lock on ``<name>.lock`` (held for
   the whole download, across processes); a second download of the same file
   is refused at once rather than appending to the same partial file.
3. Refuse to start if the free space is short of what remains.
4. Stream into ``<name>.partial`` with an HTTP ``Range`` from its current
   size. The answer must say (``Content-Range``) that its bytes start there;
   a server that answers from byte 0 starts the file over, any other offset
   is refused.
5. The token goes only to the hub: when the hub redirects to a CDN on
   another origin, the request there carries no ``Authorization``.
6. The completed file *on disk* is checked — its size against the hub's, its
   sha256 against the ETag — and only then renamed to its final name; a
   mismatch deletes it (it is corrupt) and says so.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from engine.errors import EngineError
from engine.store.hub_names import HubNameError, check_filename, check_repo_id

CHUNK = 1 << 20
SHA256_LEN = 64
_CONTENT_RANGE = re.compile(r"^\s*bytes\s+(\d+)-(\d+)/(\d+|\*)\s*$", re.IGNORECASE)
# Origins the hub's own redirects may go to with the token (huggingface_hub trusts the same ones).
_HUB_ORIGINS = frozenset({("https", "huggingface.co", 443), ("https", "hf.co", 443)})


class DownloadError(EngineError):
    kind = "download"


class DiskFullError(DownloadError):
    kind = "disk_full"


class DownloadCancelled(DownloadError):
    kind = "cancelled"


@dataclass(frozen=True)
class Progress:
    filename: str
    done: int
    total: int
    bytes_per_s: float
    resumed_from: int


ProgressFn = Callable[[Progress], None]


def _expected_sha256(etag: str | None) -> str | None:
    if not etag:
        return None
    tag = etag.strip('"').removeprefix("W/").strip('"')
    return tag if len(tag) == SHA256_LEN and all(c in "0123456789abcdef" for c in tag) else None


def download(repo_id: str, filename: str, dest_dir: str | Path, *, revision: str = "main",
             token: str | None = None, progress: ProgressFn | None = None,
             cancel: threading.Event | None = None, endpoint: str | None = None) -> Path:
    """Download ``filename`` of ``repo_id`` into ``dest_dir`` (resuming), verify it, return its path.

    Raises:
        DiskFullError: not enough free space for the rest of the file.
        DownloadCancelled: ``cancel`` was set; the partial file is kept for a later resume.
        DownloadError: HTTP failure, the same file already downloading elsewhere, a server that answers a
            resume with other bytes, or a size or sha256 that does not match the hub's.
    """
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    endpoint = _endpoint(endpoint)
    try:  # before the folder is made: a bad name leaves nothing behind
        check_repo_id(repo_id)
        check_filename(filename)
    except HubNameError as exc:
        raise DownloadError(str(exc)) from None
    dest_dir = Path(dest_dir)
    dest_dir.mkdir(parents=True, exist_ok=True)
    final = dest_dir / Path(filename).name
    url = hf_hub_url(repo_id, filename, revision=revision, endpoint=endpoint)
    with _exclusive(final.with_name(final.name + ".lock"), filename):
        try:
            meta = get_hf_file_metadata(url, token=token, endpoint=endpoint)
        except Exception as exc:
            raise DownloadError(_explain(exc, repo_id, filename)) from exc
        target = meta.location or url
        job = _Job(filename, final, int(meta.size) if meta.size is not None else None,
                   _expected_sha256(meta.etag), progress, cancel)
        headers = {"Accept-Encoding": "identity"}  # the bytes as stored: sizes and ranges are of those
        if token and _may_send_token(url, target):
            headers["Authorization"] = f"Bearer {token}"
        return job.run(target, headers)


@dataclass
class _Job:
    """One download, run while holding the file's lock."""

    filename: str
    final: Path
    total: int | None
    expected: str | None
    progress: ProgressFn | None
    cancel: threading.Event | None

    @property
    def partial(self) -> Path:
        return self.final.with_name(self.final.name + ".partial")

    def run(self, url: str, headers: dict[str, str]) -> Path:
        if self._final_is_good():
            return self.final
        have = self._usable_partial()
        if self.total is None or have < self.total or not self.partial.exists():
            self._check_space(have)
            if have:
                headers = {**headers, "Range": f"bytes={have}-"}
            self._fetch(url, headers, have)
        self._verify()
        os.replace(self.partial, self.final)
        return self.final

    def _final_is_good(self) -> bool:
        f = self.final
        return (f.exists() and self.total is not None and f.stat().st_size == self.total
                and (self.expected is None or _sha256(f) == self.expected))

    def _usable_partial(self) -> int:
        """Bytes already on disk; a partial longer than the file cannot be its start, so it goes."""
        have = self.partial.stat().st_size if self.partial.exists() else 0
        if self.total is not None and have > self.total:
            self.partial.unlink()
            have = 0
        return have

    def _check_space(self, have: int) -> None:
        if self.total is None:
            return
        free = shutil.disk_usage(self.final.parent).free
        if self.total - have > free:
            raise DiskFullError(
                f"{self.filename} needs {(self.total - have) / 2**30:.2f} GiB more, but only {free / 2**30:.2f} GiB "
                f"are free in {self.final.parent}. Free some space or choose another folder."
            )

    def _fetch(self, url: str, headers: dict[str, str], have: int) -> None:
        """GET the rest into the partial file. Redirects are followed by httpx, which drops ``Authorization``
        when one leaves the origin (as huggingface_hub relies on)."""
        from huggingface_hub.utils import get_session

        try:
            with get_session().stream("GET", url, headers=headers, follow_redirects=True, timeout=60) as resp:
                if resp.status_code not in (200, 206):
                    raise DownloadError(self._refusal(resp.status_code, have))
                start = _body_start(resp.status_code, resp.headers.get("Content-Range"), have, self.filename)
                self._check_server_total(_server_total(resp.headers, start))
                self._write(resp, start)
        except DownloadError:
            raise
        except OSError as exc:
            if exc.errno == 28:  # ENOSPC
                raise DiskFullError(
                    f"The disk filled up while downloading {self.filename}; the part downloaded is kept."
                ) from exc
            raise DownloadError(f"Downloading {self.filename} failed: {exc}; it resumes next time.") from exc
        except Exception as exc:
            raise DownloadError(f"Downloading {self.filename} failed: {exc}; it resumes next time.") from exc

    def _refusal(self, status: int, have: int) -> str:
        if status == 416 and have:  # the server will not resume here: the part cannot be trusted either
            self.partial.unlink(missing_ok=True)
            return (f"The server refused to resume {self.filename} at byte {have} (HTTP 416); the partial download "
                    "was discarded. Try again to download it from the start.")
        return f"The hub answered HTTP {status} for {self.filename}."

    def _check_server_total(self, server_total: int | None) -> None:
        """Without a sha256 (a git-style ETag) the size is the only check: the hub's and the server's must agree."""
        if self.total is None:
            self.total = server_total
        elif server_total is not None and server_total != self.total:
            raise DownloadError(
                f"For {self.filename} the hub says {self.total} bytes, but the download server sends a file of "
                f"{server_total} bytes; nothing was written. Try again later; if it persists, the repository's "
                "file is inconsistent on the hub."
            )
        if self.total is None and self.expected is None:
            raise DownloadError(f"Neither the hub nor the download server gives the size or the sha256 of "
                                f"{self.filename}, so it could not be verified; it was not downloaded.")

    def _write(self, resp: Any, start: int) -> None:
        """Append at ``start`` (the partial's size) or, for a body from byte 0, write the file afresh."""
        started, done = time.monotonic(), start
        with self.partial.open("ab" if start else "wb") as out:
            for block in resp.iter_bytes():  # as received: a dropped connection loses nothing
                if self.cancel is not None and self.cancel.is_set():
                    raise DownloadCancelled(f"Download of {self.filename} cancelled at {done} of {self.total} bytes; "
                                            "it resumes from there next time.")
                out.write(block)
                done += len(block)
                if self.progress is not None:
                    elapsed = max(1e-6, time.monotonic() - started)
                    self.progress(Progress(self.filename, done, self.total or 0, (done - start) / elapsed, start))

    def _verify(self) -> None:
        """Check the file as it is on disk, not the bytes as they arrived: only that covers a partial written
        across restarts, by a server that sent the wrong part, or changed by anything else meanwhile."""
        size = self.partial.stat().st_size
        if self.total is not None and size < self.total:
            raise DownloadError(f"{self.filename}: the download ended at {size} of {self.total} bytes; "
                                "it resumes next time.")
        if self.total is not None and size > self.total:
            self.partial.unlink()
            raise DownloadError(f"{self.filename} came out {size} bytes long, but the hub says {self.total}; the "
                                "download was discarded. Try again.")
        if self.expected is None:
            return
        actual = _sha256(self.partial, self.cancel, self.filename)
        if actual != self.expected:
            self.partial.unlink()
            raise DownloadError(f"{self.filename} arrived corrupt (sha256 {actual[:12]}…, the hub says "
                                f"{self.expected[:12]}…); the download was discarded. Try again.")


def _body_start(status: int, content_range: str | None, have: int, filename: str) -> int:
    """Where the body's first byte belongs in the file. A 200 is the whole file (a server that ignored the
    ``Range``); a 206 must say where its bytes start: at ``have`` they are appended, at 0 the file starts over,
    anywhere else they are of no use."""
    if status == 200:
        return 0
    m = _CONTENT_RANGE.match(content_range or "")
    if not m:
        raise DownloadError(f"The server answered the download of {filename} with part of the file but did not say "
                            f"which part (Content-Range {content_range!r}); nothing was written. Try again later.")
    start = int(m.group(1))
    if start not in (have, 0):
        raise DownloadError(f"The server sent {filename} from byte {start} when asked to resume at byte {have}; "
                            "nothing was written and the part already downloaded is kept. Try again later.")
    return start


def _server_total(headers: Any, start: int) -> int | None:
    """The file's size as the download server states it: ``Content-Range``'s total, else where the body starts
    plus its ``Content-Length``."""
    m = _CONTENT_RANGE.match(headers.get("Content-Range") or "")
    if m and m.group(3) != "*":
        return int(m.group(3))
    length = headers.get("Content-Length")
    if length is not None and length.strip().isdigit() and "Content-Encoding" not in headers:
        return start + int(length)
    return None


def _origin(url: str) -> tuple[str, str, int]:
    u = urlparse(url)
    return u.scheme, (u.hostname or "").lower(), u.port or {"http": 80, "https": 443}.get(u.scheme, 0)


def _may_send_token(hub_url: str, target: str) -> bool:
    """The token is for the hub: the origin it was asked of, or the hub's own hosts — never a CDN or storage host
    a redirect points to (the hub signs those URLs; a token there would leak to a third party)."""
    return _origin(target) == _origin(hub_url) or _origin(target) in _HUB_ORIGINS


@contextmanager
def _exclusive(lock_path: Path, filename: str) -> Iterator[None]:
    """Hold an OS lock on ``lock_path`` for the download, or refuse at once: two downloads of one file would
    append to one partial file. The OS releases the lock when its process dies, so a killed download never leaves
    the file stuck; the lock file it leaves behind is harmless."""
    fd = _acquire(lock_path, filename)
    try:
        yield
    finally:
        with suppress(OSError):  # removed while still held, so no one can be holding the file it named
            lock_path.unlink()
        _unlock(fd)
        os.close(fd)


def _acquire(lock_path: Path, filename: str) -> int:
    busy = DownloadError(f"{filename} is already being downloaded by another process (another MTP Studio window, "
                         "or `mtp-studio models download`). Wait for that download to finish, or cancel it and "
                         "try again.")
    for _ in range(5):
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise DownloadError(f"Cannot write in {lock_path.parent} ({exc.strerror}); choose another folder "
                                "for models.") from exc
        try:
            _lock(fd)
        except OSError:
            os.close(fd)
            raise busy from None
        if _still_names(lock_path, fd):
            return fd
        _unlock(fd)  # the holder removed it between our open and lock: lock the file the name now gives
        os.close(fd)
    raise busy


def _still_names(path: Path, fd: int) -> bool:
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except OSError:
        return False


if os.name == "nt":
    import msvcrt

    def _lock(fd: int) -> None:
        msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)

    def _unlock(fd: int) -> None:
        with suppress(OSError):
            msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)
else:
    import fcntl

    def _lock(fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)

    def _unlock(fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_UN)


def _sha256(path: Path, cancel: threading.Event | None = None, filename: str = "") -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            if cancel is not None and cancel.is_set():
                raise DownloadCancelled(f"Checking {filename} was cancelled; the file is kept and checked next time.")
            digest.update(block)
    return digest.hexdigest()


def _endpoint(endpoint: str | None) -> str | None:
    """``HF_ENDPOINT`` is read per call (huggingface_hub reads it once, at import)."""
    return endpoint or os.environ.get("HF_ENDPOINT") or None


def _explain(exc: Exception, repo_id: str, filename: str) -> str:
    """The hub's refusal in words a user can act on."""
    status = getattr(getattr(exc, "response", None), "status_code", None)
    if status == 401 or status == 403:
        return (f"{repo_id} needs an access token (it is gated or private). Accept its terms on the hub, then "
                "save your token in the Models page (or set HF_TOKEN).")
    if status == 404:
        return f"{filename} is not in {repo_id} (HTTP 404). The repository may have renamed or removed it."
    return f"Could not look up {repo_id}/{filename}: {exc}"
