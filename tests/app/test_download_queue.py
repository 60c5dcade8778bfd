"""The download queue owns the jobs: each file downloads once at a time, a job says how it ended in signals,
a cancelled job keeps its partial file for the next job to resume, and the rows only draw what jobs report.
Real downloads from a loopback hub (tests/fake_hub.py)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from app.models.download_queue import DownloadQueue
from app.models.downloads_view import DownloadsView
from engine.store import credentials
from tests.fake_hub import FakeHub

REPO = "test/Blob-GGUF"
SIZE = 2 << 20


@pytest.fixture()
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    files = {}
    for i, name in enumerate(("Blob-Q8_0.gguf", "mtp-Blob-Q8_0.gguf")):
        path = tmp_path / "src" / name
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(random.Random(i).randbytes(SIZE))
        files[name] = path
    monkeypatch.setattr(credentials, "get_token", lambda: None)  # never the real keyring
    with FakeHub({REPO: files}) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        yield server


@pytest.fixture()
def queue(qtbot, tmp_path: Path) -> DownloadQueue:
    q = DownloadQueue(folder=lambda repo: tmp_path / "models" / repo.replace("/", "__"))
    yield q
    q.cancel_all()


def test_each_job_ends_in_a_verified_file_and_the_queue_announces_it(qtbot, hub, queue, tmp_path):
    added, downloaded = [], []
    queue.sig_added.connect(added.append)
    queue.sig_downloaded.connect(downloaded.append)
    view = DownloadsView(queue)
    qtbot.addWidget(view)
    target, sidecar = queue.start(REPO, "Blob-Q8_0.gguf"), queue.start(REPO, "mtp-Blob-Q8_0.gguf")
    assert added == [target, sidecar] == queue.jobs and target.running and sidecar.running
    with qtbot.waitSignals([target.sig_finished, sidecar.sig_finished], timeout=30000):
        pass
    folder = tmp_path / "models" / "test__Blob-GGUF"
    assert sorted(downloaded) == [folder / "Blob-Q8_0.gguf", folder / "mtp-Blob-Q8_0.gguf"]
    assert target.path == folder / "Blob-Q8_0.gguf" and not target.running and target.error is None
    assert target.path.read_bytes() == hub.repos[REPO]["Blob-Q8_0.gguf"].read_bytes()
    assert target.progress is not None and target.progress.done == target.progress.total == SIZE
    assert [view.row_of(j).speed.text() for j in (target, sidecar)] == ["done, verified"] * 2
    assert not view.row_of(target).cancel.isEnabled()


def test_a_file_asked_for_again_while_it_downloads_gets_the_running_job(qtbot, hub, queue):
    hub.slow_chunk_s = 0.05
    first = queue.start(REPO, "Blob-Q8_0.gguf")
    with qtbot.waitSignal(queue.sig_already_running) as again:
        assert queue.start(REPO, "Blob-Q8_0.gguf") is first
    assert again.args == [first] and queue.jobs == [first]
    hub.slow_chunk_s = 0.0
    with qtbot.waitSignal(first.sig_finished, timeout=30000):
        pass
    second = queue.start(REPO, "Blob-Q8_0.gguf")  # finished: asking again downloads again
    assert second is not first and queue.jobs == [first, second]
    with qtbot.waitSignal(second.sig_finished, timeout=30000):
        pass


def test_a_cancelled_job_fails_keeps_its_part_and_the_next_job_resumes_it(qtbot, hub, queue):
    hub.slow_chunk_s = 0.05
    view = DownloadsView(queue)
    qtbot.addWidget(view)
    job = queue.start(REPO, "Blob-Q8_0.gguf")
    with qtbot.waitSignal(job.sig_progress, timeout=30000):
        pass
    with qtbot.waitSignal(job.sig_failed, timeout=30000) as failed:
        view.row_of(job).cancel.click()
    assert "cancelled" in failed.args[0] and job.error == failed.args[0] and job.path is None
    assert queue.running(REPO, "Blob-Q8_0.gguf") is None
    assert view.row_of(job).speed.text() == failed.args[0]
    hub.slow_chunk_s = 0.0
    again = queue.start(REPO, "Blob-Q8_0.gguf")
    with qtbot.waitSignal(again.sig_finished, timeout=30000):
        pass
    assert again.progress is not None and again.progress.resumed_from > 0
    assert again.path.read_bytes() == hub.repos[REPO]["Blob-Q8_0.gguf"].read_bytes()
