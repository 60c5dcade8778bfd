"""The Models page does its slow work off the GUI thread and never twice at
once: a download that is running is not started again, and the pair's live
probe runs in the background while the header verdict shows."""

from __future__ import annotations

import threading
from pathlib import Path

import app.models.download_queue as queue_module
from app.models_page import ModelsPage
from tests.engine.conftest import synth

REPO = "test/Blob-GGUF"
NAME = "Blob-Q8_0.gguf"


def test_the_models_page_does_not_start_a_download_that_is_running(qtbot, isolated_dirs, monkeypatch):
    release, calls = threading.Event(), []

    def fake_download(repo, filename, dest, **_kw):
        calls.append((repo, filename))
        release.wait(10)
        return Path(dest) / filename

    monkeypatch.setattr(queue_module, "download", fake_download)
    monkeypatch.setattr(ModelsPage, "refresh_library", lambda self: None)
    page = ModelsPage()
    qtbot.addWidget(page)
    first = page.queue.start(REPO, NAME)
    assert page.queue.start(REPO, NAME) is first
    assert page.downloads.rows.count() == 1
    assert "already downloading" in page.hub.sidecar_hint.text()
    qtbot.waitUntil(lambda: len(calls) == 1, timeout=5000)
    release.set()
    qtbot.waitUntil(lambda: page.downloads.row_of(first).speed.text().startswith("done"), timeout=5000)
    again = page.queue.start(REPO, NAME)  # finished: a new download may start
    assert again is not first and page.downloads.rows.count() == 2
    qtbot.waitUntil(lambda: page.downloads.row_of(again).speed.text().startswith("done"), timeout=5000)
    assert calls == [(REPO, NAME), (REPO, NAME)]


def test_the_models_page_probes_the_pair_in_the_background(qtbot, isolated_dirs):
    model, other = synth("glm4moe"), synth("glm4moe", seed=1)
    page = ModelsPage()
    qtbot.addWidget(page)
    page.pair.target_path, page.pair.sidecar_path = str(model.path("trunk")), str(other.path("sidecar"))
    page.pair.probe_check.setChecked(True)
    page.pair.doctor_button.click()
    # the header verdict first; the probe's child process is waited for on a pool thread
    qtbot.waitUntil(lambda: "Live probe: drafting" in page.library.facts.toPlainText(), timeout=10000)
    assert "fits" in page.library.facts.toPlainText()
    assert not page.pair.doctor_button.isEnabled()
    qtbot.waitUntil(lambda: "almost never accepted" in page.library.facts.toPlainText(), timeout=120000)
    assert page.pair.doctor_button.isEnabled()
