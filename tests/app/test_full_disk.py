"""A full disk while a reply streams (issue 31, item 3): the reply is kept in
memory and on screen, the chat says it is not saved, the reply ends and the
chat takes the next message, and the reply reaches the database once space
is freed. The data folder is a real, small tmpfs that the test fills."""

from __future__ import annotations

import errno
import sqlite3
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.app.conftest import start_and_load

TMPFS_SIZE = "16m"  # room for the database and its WAL; the filler takes the rest


@contextmanager
def tmpfs(folder: Path) -> Iterator[None]:
    """``folder`` (made here) on a tmpfs of its own; skips the test where mounting is not allowed."""
    folder.mkdir()
    try:
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE}", "tmpfs", str(folder)],
                                 capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"cannot mount a tmpfs here: {exc}")
    if mounted.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not allowed here: {mounted.stderr.strip() or mounted.returncode}")
    try:
        yield
    finally:
        if subprocess.run(["umount", str(folder)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(folder)], capture_output=True)  # a file still open: detach it


@pytest.fixture()
def data_on_tmpfs(tmp_path: Path, default_model: Path) -> Iterator[Path]:
    """The app's data folder (``tmp_path / "data"``, as the services fixture sets it) on its own tmpfs.

    Requested before ``services``, so it is unmounted after the app has closed its database. Its
    ``models`` folder links to the built-in model assembled once per session, which would not fit."""
    data = tmp_path / "data"
    with tmpfs(data):
        (data / "models").symlink_to(default_model.parent, target_is_directory=True)
        yield data


@pytest.fixture()
def config_on_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """The app's config folder (``tmp_path / "config"``, where settings.json lives) on its own tmpfs."""
    config = tmp_path / "config"
    with tmpfs(config):
        yield config


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
    monkeypatch.setattr("app.chat.reply_stream.SAVE_INTERVAL_S", 0.0)  # a write per token, as a long reply makes
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


# -- the other writes (issue 31, "full disk, the other writes") -----------------------------------
def stored_messages(db: Path, conversation_id: int) -> list[tuple[str, str, str]]:
    """(role, content, status) of a conversation's rows, as another reader sees them."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return conn.execute("SELECT role, content, status FROM messages WHERE conversation_id=? ORDER BY id",
                            (conversation_id,)).fetchall()
    finally:
        conn.close()


def stored_conversation(db: Path, conversation_id: int) -> tuple[str, str, str] | None:
    """(title, system prompt, settings JSON) of a conversation, None when it is not there."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return conn.execute("SELECT title, system_prompt, settings FROM conversations WHERE id=?",
                            (conversation_id,)).fetchone()
    finally:
        conn.close()


def two_version_chat(services) -> tuple[int, int]:
    """A chat whose reply has two versions, the second shown: (conversation id, reply id)."""
    store = services.store
    conv = store.create("Rivers")
    store.add_message(conv.id, "user", "Tell me about the river.")
    reply = store.add_message(conv.id, "assistant", "First answer.")
    store.new_version(reply.id)
    store.update_message(reply.id, content="Second answer.", status="complete")
    services.window.chat.open(conv.id)
    services.window.conversation_list.refresh()
    return conv.id, reply.id


def test_regenerate_on_a_full_disk_keeps_the_reply_shown_and_works_once_space_returns(
        data_on_tmpfs, services, qtbot, request):
    request.addfinalizer(services.instance.release)
    start_and_load(qtbot, services)
    window, chat = services.window, services.window.chat
    services.settings.max_tokens = 5
    with qtbot.waitSignal(chat.sig_reply_finished, timeout=60000):
        window.composer.setPlainText("Tell me about the river.")
        window.send()
    shown = chat.transcript.messages[-1]
    first = (shown.content, shown.status)
    db = data_on_tmpfs / "conversations.sqlite3"
    before = stored_messages(db, chat.conversation_id)
    asked: list[str] = []
    services.client.sig_token.connect(lambda ev: asked.append(ev.id))

    filler = fill(data_on_tmpfs)
    window.chat_pane.regen_button.click()
    qtbot.wait(300)  # a request sent anyway would answer within this
    assert not chat.busy and window.chat_pane.regen_button.isEnabled() and window.send_button.isEnabled()
    assert asked == []  # nothing was asked of the engine for a reply that could not be stored
    assert (chat.transcript.messages[-1].content, chat.transcript.messages[-1].status) == first
    assert chat.transcript.messages[-1].version_count == 1
    assert window.statusBar().currentMessage().startswith("The disk is full")
    assert "Regenerate" in window.statusBar().currentMessage()
    assert stored_messages(db, chat.conversation_id) == before

    filler.unlink()
    with qtbot.waitSignal(chat.sig_reply_finished, timeout=60000) as again:
        window.chat_pane.regen_button.click()
    assert again.args == ["complete"]
    assert chat.transcript.messages[-1].version_count == 2
    assert len(stored_messages(db, chat.conversation_id)) == 2


def test_switching_reply_versions_on_a_full_disk_keeps_the_shown_one_and_says_why(
        data_on_tmpfs, services, qtbot, request):
    request.addfinalizer(services.instance.release)
    chat, window = services.window.chat, services.window
    conv_id, _reply_id = two_version_chat(services)
    db = data_on_tmpfs / "conversations.sqlite3"
    before = stored_messages(db, conv_id)
    filler = fill(data_on_tmpfs)

    chat.transcript.sig_version.emit(1, -1)  # the transcript's ‹ on the reply
    shown = chat.transcript.messages[1]
    assert (shown.content, shown.version, shown.version_count) == ("Second answer.", 1, 2)
    assert window.statusBar().currentMessage().startswith("The disk is full")
    assert stored_messages(db, conv_id) == before

    filler.unlink()
    chat.transcript.sig_version.emit(1, -1)
    shown = chat.transcript.messages[1]
    assert (shown.content, shown.version) == ("First answer.", 0)
    assert stored_messages(db, conv_id)[1][1] == "First answer."


def test_chat_settings_on_a_full_disk_stay_in_the_dialog_until_they_are_saved(
        data_on_tmpfs, services, qtbot, request, monkeypatch):
    from app.chat.chat_settings import ChatSettingsDialog

    request.addfinalizer(services.instance.release)
    window = services.window
    conv_id, _ = two_version_chat(services)
    db = data_on_tmpfs / "conversations.sqlite3"
    before = stored_conversation(db, conv_id)
    filler = fill(data_on_tmpfs)
    seen: list[tuple[int, str, str]] = []

    def user(dialog: ChatSettingsDialog) -> int:
        dialog.system_prompt.setPlainText("Answer in French.")
        dialog.reply.max_tokens.setValue(77)
        dialog.accept()  # OK on a full disk: refused, the dialog stays with what was typed
        seen.append((dialog.result(), dialog.system_prompt.toPlainText(), dialog.problem.text()))
        filler.unlink()
        dialog.accept()  # OK again once there is room
        return dialog.result()

    monkeypatch.setattr(ChatSettingsDialog, "exec", user)
    window.open_chat_settings()
    result, prompt, problem = seen[0]
    assert result == 0 and prompt == "Answer in French."
    assert problem.startswith("The disk is full") and "OK" in problem
    title, system_prompt, settings = stored_conversation(db, conv_id)
    assert system_prompt == "Answer in French." and '"max_tokens": 77' in settings
    assert before is not None and before[1] == ""


def test_rename_delete_and_new_chat_on_a_full_disk_say_why_and_work_once_space_returns(
        data_on_tmpfs, services, qtbot, request, monkeypatch):
    from PySide6.QtWidgets import QInputDialog, QMessageBox

    request.addfinalizer(services.instance.release)
    window, convs = services.window, services.window.conversation_list
    conv_id, _ = two_version_chat(services)
    db = data_on_tmpfs / "conversations.sqlite3"
    filler = fill(data_on_tmpfs)

    asked: list[tuple[str, str]] = []

    def get_text(_parent, _title, label, *_args, text="", **_kw):
        asked.append((label, text))
        if len(asked) == 1:
            return "Rivers of Europe", True
        if len(asked) == 2:  # asked again, with what was typed and why
            filler.unlink()
            return text, True
        raise AssertionError("asked a third time")

    monkeypatch.setattr(QInputDialog, "getText", get_text)
    convs.rename(conv_id)
    assert len(asked) == 2
    assert asked[1][1] == "Rivers of Europe" and asked[1][0].startswith("The disk is full")
    assert stored_conversation(db, conv_id)[0] == "Rivers of Europe"

    filler = fill(data_on_tmpfs)
    monkeypatch.setattr(QMessageBox, "question", lambda *_a, **_k: QMessageBox.StandardButton.Yes)
    convs.ask_delete(conv_id)
    assert stored_conversation(db, conv_id) is not None  # still there, and still shown
    assert window.chat.conversation_id == conv_id
    assert window.statusBar().currentMessage().startswith("The disk is full")
    assert "not deleted" in window.statusBar().currentMessage()

    convs.new_chat()  # Ctrl+N: no new chat can be written
    assert window.chat.conversation_id == conv_id
    assert window.statusBar().currentMessage().startswith("The disk is full")

    filler.unlink()
    convs.ask_delete(conv_id)
    assert stored_conversation(db, conv_id) is None and window.chat.conversation_id is None
    convs.new_chat()
    assert window.chat.conversation_id is not None


def test_a_send_with_room_for_the_message_but_not_its_reply_stores_neither_and_asks_nothing(
        data_on_tmpfs, services, qtbot, request):
    request.addfinalizer(services.instance.release)
    start_and_load(qtbot, services)
    window, chat, store = services.window, services.window.chat, services.store
    services.settings.max_tokens = 4
    conv_id = chat.new_conversation()
    # the database may not grow by a page: a ~4 KB message fills the messages page and still fits,
    # its empty reply row then needs a new page (the page cap stands in for a disk that fills there)
    pages = store.db.execute("PRAGMA page_count").fetchone()[0]
    store.db.execute(f"PRAGMA max_page_count={pages}")
    text = ("The river runs past the old mill. " * 130)[:4015].strip()
    asked: list[str] = []
    services.client.sig_token.connect(lambda ev: asked.append(ev.id))
    window.composer.setPlainText(text)
    window.send()
    qtbot.wait(300)
    assert window.composer.toPlainText() == text
    assert not chat.busy and window.send_button.isEnabled()
    assert asked == []
    assert store.messages(conv_id) == []  # the message and its reply row together, or neither
    assert window.statusBar().currentMessage().startswith("The disk is full")

    store.db.execute("PRAGMA max_page_count=1073741823")
    with qtbot.waitSignal(chat.sig_reply_finished, timeout=90000) as finished:
        window.send()
    assert finished.args == ["complete"]
    assert [m.role for m in store.messages(conv_id)] == ["user", "assistant"]


def test_closing_with_a_reply_waiting_for_space_asks_and_saves_it_on_retry(
        data_on_tmpfs, services, qtbot, request, monkeypatch):
    from PySide6.QtWidgets import QMessageBox

    request.addfinalizer(services.instance.release)
    window, chat = services.window, services.window.chat
    conv_id, reply_id = two_version_chat(services)
    db = data_on_tmpfs / "conversations.sqlite3"
    window.show()
    filler = fill(data_on_tmpfs)
    assert not chat.saver.save(reply_id, content="A reply that streamed onto a full disk.", status="complete")
    shown: list[tuple[str, list[str]]] = []
    answers = ["Cancel", "Retry"]

    def ask(box: QMessageBox) -> int:
        shown.append((box.text(), [b.text() for b in box.buttons()]))
        answer = answers.pop(0)
        if answer == "Retry":
            filler.unlink()
        next(b for b in box.buttons() if b.text() == answer).click()
        return 0

    monkeypatch.setattr(QMessageBox, "exec", ask)
    window.close()
    assert window.isVisible()  # Cancel: the app stays, the reply still waits
    text, buttons = shown[0]
    assert "not saved" in text and "disk is full" in text.lower()
    assert set(buttons) >= {"Retry", "Quit without saving", "Cancel"}
    assert stored_messages(db, conv_id)[1][1] == "Second answer."

    window.close()
    assert not window.isVisible()
    assert stored_messages(db, conv_id)[1][1:] == ("A reply that streamed onto a full disk.", "complete")


def test_closing_on_a_full_disk_can_quit_knowingly(data_on_tmpfs, services, qtbot, request, monkeypatch):
    from PySide6.QtWidgets import QMessageBox

    request.addfinalizer(services.instance.release)
    window, chat = services.window, services.window.chat
    _conv_id, reply_id = two_version_chat(services)
    window.show()
    filler = fill(data_on_tmpfs)
    chat.saver.save(reply_id, content="Lost on purpose.")
    shown: list[str] = []

    def ask(box: QMessageBox) -> int:
        shown.append(box.text())
        next(b for b in box.buttons() if b.text() == "Quit without saving").click()
        return 0

    monkeypatch.setattr(QMessageBox, "exec", ask)
    window.close()
    assert len(shown) == 1 and not window.isVisible()
    filler.unlink()


def test_preferences_on_a_full_config_disk_are_kept_and_the_close_says_so(
        config_on_tmpfs, services, qtbot, monkeypatch):
    from PySide6.QtWidgets import QMessageBox

    from app.settings import Settings
    from app.settings_dialog import SettingsDialog

    window = services.window
    window.show()
    filler = fill(config_on_tmpfs)

    def user(dialog: SettingsDialog) -> int:
        dialog.system_prompt.setPlainText("Be brief.")
        dialog.accept()
        return dialog.result()

    monkeypatch.setattr(SettingsDialog, "exec", user)
    window.open_settings()  # the preferences apply now; the file cannot be written
    assert services.settings.system_prompt == "Be brief."
    assert "not be saved" in window.statusBar().currentMessage()
    shown: list[str] = []

    def ask(box: QMessageBox) -> int:
        shown.append(box.text())
        filler.unlink()
        next(b for b in box.buttons() if b.text() == "Retry").click()
        return 0

    monkeypatch.setattr(QMessageBox, "exec", ask)
    window.close()
    assert len(shown) == 1 and "preferences" in shown[0].lower()
    assert not window.isVisible()
    assert Settings.read()[0].system_prompt == "Be brief."


def test_a_reply_waiting_for_space_shows_as_kept_when_its_chat_is_opened_again(data_on_tmpfs, services, request):
    request.addfinalizer(services.instance.release)
    window, chat = services.window, services.window.chat
    conv_id, reply_id = two_version_chat(services)
    other = services.store.create("Other chat")
    filler = fill(data_on_tmpfs)
    chat.saver.save(reply_id, content="Kept in memory.", status="complete")
    chat.open(other.id)
    chat.open(conv_id)  # the database still holds the older text; the chat shows the newer one
    assert chat.transcript.messages[1].content == "Kept in memory."
    assert "Kept in memory." in chat.transcript.toPlainText()
    filler.unlink()
    assert chat.saver.flush()
    assert window.chat_pane.save_notice.isHidden()


# -- starting on a full disk -----------------------------------------------------------------------
@pytest.mark.parametrize("room", [0, 4096], ids=["no room at all", "room for the lock file only"])
def test_starting_on_a_full_disk_says_so_and_leaves_the_database_as_it_was(
        data_on_tmpfs, qtbot, monkeypatch, room):
    from PySide6.QtWidgets import QMessageBox

    from app.application import CannotStart, Services, run
    from app.chat.store import ConversationStore

    monkeypatch.setenv("MTP_STUDIO_DATA_DIR", str(data_on_tmpfs))
    db = data_on_tmpfs / "conversations.sqlite3"
    store = ConversationStore(db)
    conv = store.create("Last week's chat")
    store.add_message(conv.id, "user", "Tell me about the river.")
    store.add_message(conv.id, "assistant", "It runs", status="streaming")  # the app was killed mid-reply
    store.close()
    filler = fill(data_on_tmpfs)
    if room:
        with open(filler, "r+b") as f:
            f.truncate(filler.stat().st_size - room)

    with pytest.raises(CannotStart, match="(?i)disk is full") as refused:
        Services()
    assert "already running" not in str(refused.value)
    assert "Free some space" in str(refused.value)
    assert not [p.name for p in data_on_tmpfs.iterdir() if "unreadable" in p.name]  # not taken for damaged
    shown: list[tuple[str, str]] = []
    monkeypatch.setattr(QMessageBox, "critical", lambda _parent, title, text, *_a, **_k: shown.append((title, text)))
    assert run([]) == 1
    assert shown and shown[0][0] == "MTP Studio cannot start" and "disk is full" in shown[0][1].lower()

    filler.unlink()
    services = Services()
    try:
        qtbot.addWidget(services.window)
        assert [(m.content, m.status) for m in services.store.messages(conv.id)] == [
            ("Tell me about the river.", "complete"), ("It runs", "interrupted")]
    finally:
        services.store.close()
        services.instance.release()
