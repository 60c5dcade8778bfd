"""Resumable, verified downloads of GGUF files from the Hugging Face hub.

huggingface_hub (≥ 1.18) deletes a partial file when a download fails, so a
download killed at 50% would start over. This module keeps its own partial
file instead, using huggingface_hub for what it is good at (URLs, auth,
redirects, the LFS metadata):

1. ``get_hf_file_metadata`` gives the size and, for LFS files, the sha256
   (the ETag of an LFS object is its sha256).
2. Refuse to start if the free space is short of what remains.
3. Stream into ``<name>.partial`` with an HTTP ``Range`` from its current
   size; the sha256 of the bytes already there is computed first, so the
   whole file is hashed exactly once across restarts.
4. Only a file whose sha256 matches is renamed to its final name; a mismatch
   deletes the partial file (it is corrupt) and says so.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from engine.errors import EngineError

CHUNK = 1 << 20
SHA256_LEN = 64


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
        DownloadError: HTTP failure, or the sha256 does not match the hub's.
    """
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.utils import get_session

    endpoint = _endpoint(endpoint)
    if Path(filename).is_absolute() or ".." in Path(filename).parts:
        raise DownloadError(f"Refusing the file name {filename!r}: it would leave the models folder.")
    dest_dir = Path(dest_dir)
    dest_dir.mkdir(parents=True, exist_ok=True)
    final = dest_dir / Path(filename).name
    partial = final.with_name(final.name + ".partial")
    url = hf_hub_url(repo_id, filename, revision=revision, endpoint=endpoint)
    try:
        meta = get_hf_file_metadata(url, token=token, endpoint=endpoint)
    except Exception as exc:
        raise DownloadError(_explain(exc, repo_id, filename)) from exc
    total = int(meta.size or 0)
    expected = _expected_sha256(meta.etag)
    if final.exists() and final.stat().st_size == total and (expected is None or _sha256(final) == expected):
        return final

    have = partial.stat().st_size if partial.exists() else 0
    if have > total:
        partial.unlink()
        have = 0
    free = shutil.disk_usage(dest_dir).free
    if total - have > free:
        raise DiskFullError(
            f"{filename} needs {(total - have) / 2**30:.2f} GiB more, but only {free / 2**30:.2f} GiB are free "
            f"in {dest_dir}. Free some space or choose another folder."
        )
    digest = hashlib.sha256()
    if have:
        with partial.open("rb") as f:
            for block in iter(lambda: f.read(CHUNK), b""):
                digest.update(block)
    headers = {"Range": f"bytes={have}-"} if have else {}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    started, resumed_from, done = time.monotonic(), have, have
    try:
        with get_session().stream("GET", meta.location or url, headers=headers, follow_redirects=True,
                                  timeout=60) as resp:
            if resp.status_code not in (200, 206):
                raise DownloadError(f"The hub answered HTTP {resp.status_code} for {filename}.")
            if have and resp.status_code == 200:  # the server ignored Range: start over
                digest, done, resumed_from = hashlib.sha256(), 0, 0
            mode = "ab" if done else "wb"
            with partial.open(mode) as out:
                for block in resp.iter_bytes():  # as received: a dropped connection loses nothing
                    if cancel is not None and cancel.is_set():
                        raise DownloadCancelled(f"Download of {filename} cancelled at {done} of {total} bytes; "
                                                "it resumes from there next time.")
                    out.write(block)
                    digest.update(block)
                    done += len(block)
                    if progress is not None:
                        elapsed = max(1e-6, time.monotonic() - started)
                        progress(Progress(filename, done, total, (done - resumed_from) / elapsed, resumed_from))
    except DownloadError:
        raise
    except OSError as exc:
        if exc.errno == 28:  # ENOSPC
            raise DiskFullError(
                f"The disk filled up while downloading {filename}; the part downloaded is kept."
            ) from exc
        raise DownloadError(f"Downloading {filename} failed: {exc}; it resumes next time.") from exc
    except Exception as exc:
        raise DownloadError(f"Downloading {filename} failed: {exc}; it resumes next time.") from exc
    if done != total:
        raise DownloadError(f"{filename}: the connection ended at {done} of {total} bytes; it resumes next time.")
    if expected is not None and digest.hexdigest() != expected:
        partial.unlink()
        raise DownloadError(f"{filename} arrived corrupt (sha256 {digest.hexdigest()[:12]}…, the hub says "
                            f"{expected[:12]}…); the download was discarded. Try again.")
    os.replace(partial, final)
    return final


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
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
