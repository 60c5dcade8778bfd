"""A full disk while a reply streams (issue 31, item 3): the reply is kept in
memory and on screen, the chat says it is not saved, the reply ends and the
chat takes the next message, and the reply reaches the database once space
is freed. The data folder is a real, small tmpfs that the test fills."""

from __future__ import annotations

import errno
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.app.conftest import start_and_load

TMPFS_SIZE = "16m"  # room for the database and its WAL; the filler takes the rest


@pytest.fixture()
def data_on_tmpfs(tmp_path: Path, default_model: Path) -> Iterator[Path]:
    """The app's data folder (``tmp_path / "data"``, as the services fixture sets it) on its own tmpfs.

    Requested before ``services``, so it is unmounted after the app has closed its database. Its
    ``models`` folder links to the built-in model assembled once per session, which would not fit."""
    data = tmp_path / "data"
    data.mkdir()
    try:
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE}", "tmpfs", str(data)],
                                 capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"cannot mount a tmpfs here: {exc}")
    if mounted.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not allowed here: {mounted.stderr.strip() or mounted.returncode}")
    try:
        (data / "models").symlink_to(default_model.parent, target_is_directory=True)
        yield data
    finally:
        if subprocess.run(["umount", str(data)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(data)], capture_output=True)  # a file still open: detach it


def fill(folder: Path) -> Path:
    """Write a file in ``folder`` until its disk has no room left (down to the last byte)."""
    filler = folder / "filler.bin"
    with open(filler, "wb", buffering=0) as f:
        for chunk in (1 << 20, 1 << 16, 1 << 12, 1 << 8, 1):
            try:
                while True:
                    f.write(b"\0" * chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
    return filler


def stored_reply(db: Path, message_id: int) -> tuple[str, str]:
    """The reply's content and status as another reader of the database sees them."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        content, status = conn.execute("SELECT content, status FROM messages WHERE id=?", (message_id,)).fetchone()
    finally:
        conn.close()
    return content, status


def test_a_reply_streaming_onto_a_full_disk_ends_stays_shown_and_is_saved_when_space_returns(
        data_on_tmpfs, services, qtbot, monkeypatch, request):
    request.addfinalizer(services.instance.release)  # its lock file lives on the tmpfs, unmounted next
    monkeypatch.setattr("app.chat.controller.SAVE_INTERVAL_S", 0.0)  # a write per token, as a long reply makes
    start_and_load(qtbot, services)
    window, chat = services.window, services.window.chat
    services.settings.max_tokens = 200
    tokens: list[str] = []
    filled: list[Path] = []

    def on_token(ev) -> None:
        if ev.id != chat.request_id:
            return
        tokens.append(ev.text)
        if len(tokens) == 3:  # a few tokens saved, then the disk fills mid-reply
            filled.append(fill(data_on_tmpfs))

    services.client.sig_token.connect(on_token)
    with qtbot.waitSignal(chat.sig_reply_finished, timeout=60000) as finished:
        window.composer.setPlainText("Tell me about the river.")
        window.send()
    reply_text = "".join(tokens)
    assert filled and len(tokens) > 10, "the disk did not fill while the reply streamed"
    assert finished.args == ["complete"]
    assert not chat.busy
    assert window.send_button.isEnabled()
    assert window.chat_pane.save_notice.isVisible()
    assert window.chat_pane.save_notice.text().startswith("Disk full, not saved")
    shown = chat.transcript.messages[-1]
    assert shown.role == "assistant" and shown.content == reply_text
    db = data_on_tmpfs / "conversations.sqlite3"
    message_id = shown.id
    assert message_id is not None
    assert stored_reply(db, message_id) != (reply_text, "complete")  # the disk really refused it

    filled[0].unlink()
    qtbot.waitUntil(lambda: stored_reply(db, message_id) == (reply_text, "complete"), timeout=20000)
    qtbot.waitUntil(lambda: not window.chat_pane.save_notice.isVisible(), timeout=5000)

    services.settings.max_tokens = 5  # and the chat goes on
    with qtbot.waitSignal(chat.sig_reply_finished, timeout=60000) as again:
        window.composer.setPlainText("And the mill?")
        window.send()
    assert again.args == ["complete"]
    assert stored_reply(db, chat.transcript.messages[-1].id)[1] == "complete"


def test_a_message_sent_onto_a_full_disk_stays_in_the_composer_and_says_why(
        data_on_tmpfs, services, qtbot, request):
    request.addfinalizer(services.instance.release)
    start_and_load(qtbot, services)
    window, chat = services.window, services.window.chat
    filler = fill(data_on_tmpfs)
    window.composer.setPlainText("Tell me about the river.")
    window.send()
    assert window.composer.toPlainText() == "Tell me about the river."
    assert not chat.busy and window.send_button.isEnabled()
    assert window.statusBar().currentMessage().startswith("The disk is full: the message was not sent.")

    filler.unlink()
    services.settings.max_tokens = 5
    with qtbot.waitSignal(chat.sig_reply_finished, timeout=60000) as finished:
        window.send()
    assert finished.args == ["complete"]
    assert window.composer.toPlainText() == ""
