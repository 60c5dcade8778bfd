"""The hub searched offline, as the walkthrough did it (Models → Search Hugging Face, "qwen", Enter): the
built-in catalog's matches are read whole in the results list, which wraps them instead of hiding their ends
behind a sideways scroll bar, and the offline message ends its sentence once ("another hub).. 2 model(s)" before).
Measured: each row's rectangle against the list's viewport."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt

from app.models_page import ModelsPage
from tests.engine.test_catalog import closed_port_url


@pytest.fixture()
def page(qtbot, isolated_dirs, tmp_path, monkeypatch):
    monkeypatch.setenv("MTP_STUDIO_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("MTP_STUDIO_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_ENDPOINT", closed_port_url())
    (tmp_path / "config").mkdir()
    p = ModelsPage()
    qtbot.addWidget(p)
    yield p
    p.shutdown()


def test_offline_catalog_matches_are_read_whole_and_the_message_reads_right(qtbot, page):
    page.resize(980, 600)  # the page in a 1000×700 window
    page.sections.setCurrentIndex(2)
    page.show()
    qtbot.waitExposed(page)
    hub = page.hub
    hub.query.setFocus()
    qtbot.keyClicks(hub.query, "qwen")
    qtbot.keyClick(hub.query, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: hub.status.text().startswith("Offline") and hub.results.count() > 0, timeout=30000)
    qtbot.wait(50)
    text = hub.status.text()
    assert "model(s) in the built-in catalog match" in text and ".." not in text, text
    results = hub.results
    assert not results.horizontalScrollBar().isVisible(), "a sideways scroll bar hides the rows' ends"
    room = results.viewport().width()
    for row in range(results.count()):
        rect = results.visualItemRect(results.item(row))
        needed = results.fontMetrics().horizontalAdvance(results.item(row).text())
        assert rect.right() <= room, (results.item(row).text(), rect.width(), room)
        if needed > room:  # wrapped onto more lines: taller than one
            assert rect.height() > results.fontMetrics().height() * 1.5, results.item(row).text()
