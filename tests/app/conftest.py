"""GUI tests: the real main window, the real worker process, offscreen Qt."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from dataclasses import replace

import pytest


@pytest.fixture()
def services(qtbot, isolated_dirs, tmp_path, monkeypatch) -> Iterator[object]:
    # A fresh data folder per test: its own conversations and settings.
    monkeypatch.setenv("MTP_STUDIO_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("MTP_STUDIO_CONFIG_DIR", str(tmp_path / "config"))
    from app.application import Services

    s = Services()
    # Replies as the engine's defaults make them (greedy, no penalty): deterministic,
    # and as long as a test asks. The app's own default (Balanced: random, with a
    # repetition penalty) is tested where it is the point (tests/app/test_sampling_ui.py).
    s.settings.sampling = replace(s.settings.sampling, temperature=0.0, repeat_penalty=1.0)
    qtbot.addWidget(s.window)
    yield s
    s.client.stop()
    s.store.close()


def start_and_load(qtbot, services) -> None:
    with qtbot.waitSignal(services.client.sig_loaded, timeout=60000):
        services.start()


def type_and_send(qtbot, window, text: str, *, paste: bool = False) -> None:
    """Write ``text`` in the composer and press Send: typed key by key, or pasted at once
    (``paste``: long texts, and text no key makes)."""
    window.composer.setFocus()
    if paste:
        window.composer.setPlainText(text)
    else:
        qtbot.keyClicks(window.composer, text)
    window.send_button.click()


def write_database(path, script: str) -> None:
    """A conversation database as an older version of the app left it: ``script`` run on a new file."""
    db = sqlite3.connect(path)
    db.executescript(script)
    db.commit()
    db.close()


def send_and_wait(qtbot, window, text: str, timeout: int = 60000) -> None:
    """Put ``text`` in the composer, send it and wait until the reply has finished."""
    with qtbot.waitSignal(window.chat.sig_reply_finished, timeout=timeout):
        window.composer.setPlainText(text)
        window.send()


def reply_with_stats(qtbot, services, text: str = " the river model") -> tuple[list, list]:
    """Send ``text`` and wait for the reply; the statistics streamed meanwhile and each final one."""
    window = services.window
    live: list = []
    finals: list = []
    services.client.sig_stats.connect(lambda ev: live.append(ev.stats))
    services.client.sig_done.connect(lambda ev: finals.append(ev.stats))
    send_and_wait(qtbot, window, text, timeout=120000)
    return live, finals
