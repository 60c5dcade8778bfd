"""Downloads against hostile conditions, on a loopback hub (tests/fake_hub.py):
two downloads of one file at once, a partial file changed behind the
download's back, servers that answer a resume with the wrong bytes, and a hub
that redirects to a CDN on another origin (the token must stay on the hub)."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from engine.store import download as dl
from tests.fake_hub import FakeHub

REPO = "test/Blob-GGUF"
NAME = "Blob-Q8_0.gguf"
SIZE = 2 << 20
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def source(tmp_path: Path) -> Path:
    """2 MiB of seeded random bytes: any misplaced byte changes the hash."""
    path = tmp_path / "src" / NAME
    path.parent.mkdir()
    path.write_bytes(random.Random(17).randbytes(SIZE))
    return path


@pytest.fixture()
def server(source: Path, monkeypatch: pytest.MonkeyPatch):
    with FakeHub({REPO: {NAME: source}}) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        yield hub


def _preload(dest: Path, source: Path, n: int) -> Path:
    """A partial file holding the first ``n`` bytes, as a killed download leaves it."""
    dest.mkdir(parents=True, exist_ok=True)
    partial = dest / (NAME + ".partial")
    partial.write_bytes(source.read_bytes()[:n])
    return partial


def _leftovers(dest: Path) -> list[str]:
    return sorted(p.name for p in dest.iterdir() if p.name != NAME)


# -- 1: one download of a file at a time; the hash is of what is on disk ------------------------------------------

def test_two_downloads_of_one_file_at_once_never_give_a_corrupt_file(server, source, tmp_path):
    """The issue's reproduction, in one process: a resumable partial, a second download while the first streams.
    Before the lock both appended to one partial; the second died with FileNotFoundError."""
    dest = tmp_path / "models"
    _preload(dest, source, SIZE // 2)
    server.slow_chunk_s = 0.02
    streaming, results = threading.Event(), {}

    def first() -> None:
        try:
            results["first"] = dl.download(REPO, NAME, dest, endpoint=server.url,
                                           progress=lambda _p: streaming.set())
        except Exception as exc:  # noqa: BLE001 - reported by the assertions below
            results["first"] = exc

    t = threading.Thread(target=first)
    t.start()
    assert streaming.wait(10)
    with pytest.raises(dl.DownloadError, match="already being downloaded by another process"):
        dl.download(REPO, NAME, dest, endpoint=server.url)
    t.join(20)
    assert results["first"] == dest / NAME, results["first"]
    assert (dest / NAME).read_bytes() == source.read_bytes()
    assert _leftovers(dest) == []  # no partial, no lock file


def test_a_second_cli_download_of_the_same_file_says_so_without_a_traceback(server, source, tmp_path, capsys):
    """Two `models download` of one file, as in the issue: the first in another process (the lock is an OS file
    lock, not a lock in one interpreter), the second through the CLI here."""
    from engine.cli import main

    dest = tmp_path / "models"
    partial = _preload(dest, source, SIZE // 2)
    server.slow_chunk_s = 0.02
    env = {**os.environ, "HF_ENDPOINT": server.url, "PYTHONPATH": str(ROOT)}
    first = subprocess.Popen([sys.executable, "-m", "engine", "models", "download", REPO, NAME, "--dest", str(dest)],
                             cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 15
        while not (partial.exists() and partial.stat().st_size > SIZE // 2):  # the first one is streaming
            assert time.monotonic() < deadline and first.poll() is None, first.communicate()
            time.sleep(0.01)
        assert main(["models", "download", REPO, NAME, "--dest", str(dest)]) == 2
        second = capsys.readouterr().err
        assert "already being downloaded by another process" in second and "Traceback" not in second
        out, err = first.communicate(timeout=20)
    finally:
        first.kill() if first.poll() is None else None
    assert first.returncode == 0 and "Traceback" not in err, err
    assert out.strip() == str(dest / NAME)
    assert (dest / NAME).read_bytes() == source.read_bytes() and _leftovers(dest) == []


def test_the_hash_is_of_the_file_on_disk_not_of_the_bytes_received(server, source, tmp_path):
    """A partial changed behind the download's back (another writer, a bad disk) is caught: the completed file is
    hashed, not the stream. Before, the received bytes hashed right and the damaged file was kept."""
    dest = tmp_path / "models"
    partial = _preload(dest, source, SIZE // 2)

    damaged = []

    def damage(_p: dl.Progress) -> None:
        if damaged:
            return
        damaged.append(True)
        with partial.open("r+b") as f:  # flip one byte of the part already on disk
            f.seek(1000)
            byte = f.read(1)
            f.seek(1000)
            f.write(bytes([byte[0] ^ 0xFF]))

    with pytest.raises(dl.DownloadError, match="arrived corrupt"):
        dl.download(REPO, NAME, dest, endpoint=server.url, progress=damage)
    assert not (dest / NAME).exists() and _leftovers(dest) == []


def test_a_complete_partial_is_verified_without_asking_for_more(server, source, tmp_path):
    """A download killed while verifying leaves the whole file as .partial: a Range past its end would be refused
    (416); it is verified and renamed instead."""
    dest = tmp_path / "models"
    _preload(dest, source, SIZE)
    assert dl.download(REPO, NAME, dest, endpoint=server.url).read_bytes() == source.read_bytes()
    assert server.range_requests == [] and not server.bytes_served


# -- 2: a resume must get the bytes it asked for --------------------------------------------------------------

def test_a_resume_answered_from_byte_zero_is_never_appended(server, source, tmp_path):
    """206 with the body from byte 0 and a git-style ETag (nothing to hash against): before, appended, exit 0, a
    corrupt file. Now the body is taken for what Content-Range says it is, and the size on disk must match."""
    dest = tmp_path / "models"
    _preload(dest, source, SIZE // 2)
    server.git_etag.add(NAME)
    server.resume_from[NAME] = 0
    with pytest.raises(dl.DownloadError):
        dl.download(REPO, NAME, dest, endpoint=server.url)
    assert not (dest / NAME).exists()
    partial = dest / (NAME + ".partial")
    assert source.read_bytes().startswith(partial.read_bytes())  # whatever is kept is the file's true start
    server.resume_from.clear()
    assert dl.download(REPO, NAME, dest, endpoint=server.url).read_bytes() == source.read_bytes()


def test_a_resume_answered_from_another_offset_fails_clearly_and_keeps_the_part(server, source, tmp_path):
    dest = tmp_path / "models"
    partial = _preload(dest, source, SIZE // 2)
    server.resume_from[NAME] = 7
    with pytest.raises(dl.DownloadError, match=f"from byte 7 .*asked to resume at byte {SIZE // 2}"):
        dl.download(REPO, NAME, dest, endpoint=server.url)
    assert partial.read_bytes() == source.read_bytes()[:SIZE // 2] and not (dest / NAME).exists()


def test_a_server_that_ignores_the_range_restarts_from_zero(server, source, tmp_path):
    dest = tmp_path / "models"
    _preload(dest, source, SIZE // 2)
    server.ignore_range.add(NAME)
    server.git_etag.add(NAME)
    assert dl.download(REPO, NAME, dest, endpoint=server.url).read_bytes() == source.read_bytes()
    assert server.bytes_served[NAME] == SIZE


def test_a_git_etag_file_whose_size_disagrees_with_the_hub_is_refused(server, source, tmp_path):
    """Without a sha256 the size is all there is to check: the hub's X-Linked-Size against what the server sends.
    Before, the mismatch read as a dropped connection ("resumes next time"), and every retry failed the same way."""
    dest = tmp_path / "models"
    server.git_etag.add(NAME)
    server.advertised_size[NAME] = SIZE + 10
    with pytest.raises(dl.DownloadError, match=f"hub says {SIZE + 10} bytes.*{SIZE}"):
        dl.download(REPO, NAME, dest, endpoint=server.url)
    assert not (dest / NAME).exists()


# -- 3: the token stays on the hub ---------------------------------------------------------------------------

def test_the_token_is_not_sent_to_the_cdn_the_hub_redirects_to(source, tmp_path, monkeypatch):
    """The hub answers 302 to a CDN on another origin (a second loopback server); the token must not follow.
    Before, the download set Authorization itself on the CDN URL."""
    with FakeHub({REPO: {NAME: source}}) as cdn, FakeHub({REPO: {NAME: source}}) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        hub.token, hub.redirect_to = "hf_secret", cdn.url
        dest = tmp_path / "models"
        _preload(dest, source, SIZE // 3)
        path = dl.download(REPO, NAME, dest, endpoint=hub.url, token="hf_secret")
        assert path.read_bytes() == source.read_bytes()
        assert cdn.requests and all("authorization" not in {k.lower() for k in h} for _m, _p, h in cdn.requests)
        assert any({k.lower(): v for k, v in h.items()}.get("authorization") == "Bearer hf_secret"
                   for _m, _p, h in hub.requests)  # the hub itself did get it
        assert cdn.range_requests == [(NAME, f"bytes={SIZE // 3}-")]


def test_the_token_goes_to_the_hub_and_its_own_hosts_only(source, tmp_path, monkeypatch):
    """The other side of the rule: the hub itself, and a redirect on it (a renamed repo), still get the token."""
    with FakeHub({REPO: {NAME: source}}) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        hub.token = "hf_secret"
        assert dl._may_send_token(hub.url + "/a", hub.url + "/b")
        assert not dl._may_send_token(hub.url + "/a", "http://127.0.0.2:1/b")
        assert not dl._may_send_token("https://huggingface.co/a", "https://cas-bridge.xethub.hf.co/b")
        path = dl.download(REPO, NAME, tmp_path, endpoint=hub.url, token="hf_secret")
        assert path.read_bytes() == source.read_bytes()


# -- issue 31: names that are not names are refused before anything is created ------------------------------------

@pytest.mark.parametrize(("repo", "name", "says"), [
    (REPO, "Blob\x00-Q8_0.gguf", "NUL"),
    ("..", NAME, "'..'"),
    ("acme/..", NAME, "'acme/..'"),
    ("acme/./x", NAME, "owner/name"),
    (REPO, "../Blob-Q8_0.gguf", "leave the models folder"),
])
def test_a_bad_repo_id_or_file_name_is_refused_before_any_folder_is_made(server, tmp_path, monkeypatch, capsys,
                                                                          repo, name, says):
    """The campaign's `models download .. X` and `acme/.. X` gave an HFValidationError traceback after making an
    empty folder, and a NUL in the name a ValueError traceback; the default folder is named after the repo."""
    from engine.cli import main

    data = tmp_path / "data"
    data.mkdir()
    monkeypatch.setenv("MTP_STUDIO_DATA_DIR", str(data))
    dest = tmp_path / "dest"
    assert main(["models", "download", repo, name, "--dest", str(dest)]) == 2
    assert main(["models", "download", repo, name]) == 2  # the default folder, data/models/<repo>
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("error: Refusing") == 2 and says in err, err
    assert not dest.exists()
    assert [p.name for p in data.iterdir()] == []
    assert not any(r[0] == "GET" or r[0] == "HEAD" for r in server.requests)  # refused before asking the hub


def test_names_the_hub_has_still_download(server, source, tmp_path):
    """The checks refuse only what the hub could not hold: dots, dashes and underscores are fine."""
    from engine.store.hub_names import check_filename, check_repo_id

    for repo in ("acme/Model-1.5_b.GGUF", "gpt2", "a.b/c.d"):
        check_repo_id(repo)
    for name in ("model-Q4_K_M.gguf", "Q4_K_M/model-00001-of-00002.gguf", ".hidden.gguf"):
        check_filename(name)
    assert dl.download(REPO, NAME, tmp_path / "m", endpoint=server.url).read_bytes() == source.read_bytes()
