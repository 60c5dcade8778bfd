"""Broken files never stop the app (issue 31, item 4): a conversations
database SQLite cannot open, one bad JSON value in one row, and settings of
the wrong shape or out of range. Each start is the real app's (``Services``)
on a data folder of its own; what the user is told is the notice above the
chat."""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import pytest

from app.chat.store import ConversationStore

ASIDE = re.compile(r"conversations\.unreadable-\d{8}-\d{6}(-\d+)?\.sqlite3$")
SETTINGS_ASIDE = re.compile(r"settings\.unreadable-\d{8}-\d{6}(-\d+)?\.json$")


@pytest.fixture()
def folders(tmp_path, monkeypatch) -> tuple[Path, Path]:
    data, config = tmp_path / "data", tmp_path / "config"
    data.mkdir()
    config.mkdir()
    monkeypatch.setenv("MTP_STUDIO_DATA_DIR", str(data))
    monkeypatch.setenv("MTP_STUDIO_CONFIG_DIR", str(config))
    return data, config


def start(qtbot):
    """The real app's services, as a start builds them (no worker: only files are read)."""
    from app.application import Services

    services = Services()
    qtbot.addWidget(services.window)
    return services


def notice(services) -> str:
    shown = services.window.file_notice
    return "" if shown.isHidden() else shown.label.text()


def fill(path: Path, conversations: int = 40) -> None:
    """A sound database with ``conversations`` chats of three messages each, long enough to span many pages."""
    store = ConversationStore(path)
    for i in range(conversations):
        conv = store.create(f"chat {i}")
        for j in range(3):
            store.add_message(conv.id, "user" if j % 2 == 0 else "assistant", f"message {i}.{j} " + "x" * 400)
    store.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    store.close()


def random_bytes(path: Path) -> None:
    path.write_bytes(bytes((i * 7919 + 13) % 251 for i in range(64 * 1024)))


def truncated(path: Path) -> None:
    fill(path)
    truncated_in_place(path)


def truncated_in_place(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2 + 100])  # half a database, cut mid-page


def zeroed_header(path: Path) -> None:
    fill(path)
    data = path.read_bytes()
    path.write_bytes(b"\0" * 100 + data[100:])


@pytest.mark.parametrize("damage", [random_bytes, truncated, zeroed_header])
def test_a_database_that_will_not_open_is_set_aside_and_the_app_starts(qtbot, folders, damage):
    data, _ = folders
    db = data / "conversations.sqlite3"
    damage(db)
    original = db.read_bytes()
    services = start(qtbot)
    try:
        kept = [p for p in data.iterdir() if ASIDE.search(p.name)]
        assert len(kept) == 1 and kept[0].read_bytes() == original  # the damaged file, untouched
        text = notice(services)
        assert str(kept[0]) in text and "could not be opened" in text
        assert "Traceback" not in text
        conv = services.store.create("after")  # the new database works
        services.store.add_message(conv.id, "user", "hello")
        assert services.store.messages(conv.id)[0].content == "hello"
    finally:
        services.shutdown()


def test_a_truncated_database_gives_back_the_rows_sqlite_can_read(qtbot, folders):
    data, _ = folders
    truncated(data / "conversations.sqlite3")
    services = start(qtbot)
    try:
        conversations = services.store.list()
        assert "chat 0" in {c.title for c in conversations}  # the chats fit one early page
        messages = sum(len(services.store.messages(c.id)) for c in conversations)
        assert 0 < messages < 120  # the messages on the pages that survived, none of the cut-off ones
        first = next(c for c in services.store.list() if c.title == "chat 0")
        assert [m.content[:11] for m in services.store.messages(first.id)] == ["message 0.0", "message 0.1",
                                                                               "message 0.2"]
        assert re.search(r"\b[1-9]\d* conversation\(s\) and [1-9]\d* message\(s\) were recovered", notice(services))
    finally:
        services.shutdown()


def test_without_the_sqlite3_command_the_rows_are_copied_one_by_one(qtbot, folders, monkeypatch):
    data, _ = folders
    truncated(data / "conversations.sqlite3")
    monkeypatch.setattr("engine.store.sqlite_salvage.shutil.which", lambda name: None)
    services = start(qtbot)
    try:
        assert "chat 0" in {c.title for c in services.store.list()}
    finally:
        services.shutdown()


@pytest.mark.parametrize("cli", [True, False], ids=["sqlite3-command", "row-by-row"])
def test_a_damaged_database_gives_back_rows_whose_text_is_not_utf8_with_replacement_characters(
        qtbot, folders, monkeypatch, cli):
    # the salvage read rows with Python's default text decoding: a row holding bytes that are not
    # UTF-8 raised, was jumped over as unreadable and lost with the rows after it on its page (issue 31)
    data, _ = folders
    db = data / "conversations.sqlite3"
    fill(db)
    raw = sqlite3.connect(str(db))
    raw.execute("UPDATE conversations SET title=CAST(X'5269766572ff' AS TEXT) WHERE title='chat 0'")
    first = raw.execute("SELECT MIN(id) FROM messages").fetchone()[0]
    raw.execute("UPDATE messages SET content=CAST(X'68c3' AS TEXT) WHERE id=?", (first,))
    raw.commit()
    raw.close()
    truncated_in_place(db)
    if not cli:
        monkeypatch.setattr("engine.store.sqlite_salvage.shutil.which", lambda name: None)
    services = start(qtbot)
    try:
        assert [p for p in data.iterdir() if ASIDE.search(p.name)]  # it was damaged, and set aside
        river = [c for c in services.store.list() if c.title == "River\ufffd"]
        assert len(river) == 1 and "chat 1" in {c.title for c in services.store.list()}
        contents = [m.content for m in services.store.messages(river[0].id)]
        assert contents[0] == "h\ufffd" and [c[:11] for c in contents[1:]] == ["message 0.1", "message 0.2"]
        services.window.chat.open(river[0].id)
        assert services.window.chat.transcript.messages[0].content == "h\ufffd"
    finally:
        services.shutdown()


def test_a_second_damaged_database_never_overwrites_the_first_one_kept(qtbot, folders):
    data, _ = folders
    for n in range(2):
        random_bytes(data / "conversations.sqlite3")
        with (data / "conversations.sqlite3").open("ab") as f:
            f.write(bytes([n]))  # two different files
        start(qtbot).shutdown()
    kept = sorted(p for p in data.iterdir() if ASIDE.search(p.name))
    assert len(kept) == 2 and {p.read_bytes()[-1] for p in kept} == {0, 1}


def test_a_bad_json_value_in_one_row_spoils_that_row_only(qtbot, folders):
    data, _ = folders
    db = data / "conversations.sqlite3"
    fill(db, conversations=2)
    raw = sqlite3.connect(str(db))
    raw.execute("UPDATE conversations SET settings='{not json' WHERE title='chat 0'")
    raw.execute("UPDATE messages SET stats='[[[', versions='{\"a\":' WHERE id=1")
    raw.commit()
    raw.close()
    services = start(qtbot)
    try:
        assert {c.title for c in services.store.list()} == {"chat 0", "chat 1"}
        bad = next(c for c in services.store.list() if c.title == "chat 0")
        assert bad.settings == {}
        first = services.store.messages(bad.id)[0]
        assert first.content.startswith("message 0.0") and first.stats is None and first.version_count == 1
        services.window.chat.open(bad.id)  # shown in the transcript like any other
        assert services.window.chat.conversation_id == bad.id
        assert notice(services) == ""  # the file itself was sound: nothing set aside
    finally:
        services.shutdown()


@pytest.mark.parametrize("content, why", [
    ("[1, 2, 3]", "a JSON list, not an object"),
    ("[" * 100_000 + "]" * 100_000, "not valid JSON"),
    ("{\"n_ctx\": 4096", "not valid JSON"),
    (b"\xff\xfe{}", "not valid JSON"),
])
def test_settings_that_are_not_an_object_are_kept_aside_and_the_defaults_used(qtbot, folders, content, why):
    _, config = folders
    path = config / "settings.json"
    original = content if isinstance(content, bytes) else content.encode()
    path.write_bytes(original)
    services = start(qtbot)
    try:
        kept = [p for p in config.iterdir() if SETTINGS_ASIDE.search(p.name)]
        assert len(kept) == 1 and kept[0].read_bytes() == original
        text = notice(services)
        assert why in text and str(kept[0]) in text
        assert services.settings.n_ctx == 4096
    finally:
        services.shutdown()


def test_settings_out_of_range_reset_field_by_field_with_a_notice(qtbot, folders):
    _, config = folders
    (config / "settings.json").write_text(json.dumps({
        "n_ctx": 10**12, "n_threads": -4, "temperature": float("nan"), "theme": "purple", "n_max": 2,
        "max_tokens": 77, "system_prompt": "be brief", "recent_models": ["a.gguf", 3], "server_port": 70000,
        "n_gpu_layers": True,
    }))
    services = start(qtbot)
    try:
        s = services.settings
        assert (s.n_max, s.max_tokens, s.system_prompt) == (2, 77, "be brief")  # the good fields stay
        assert (s.n_ctx, s.theme, s.recent_models, s.server_port, s.n_gpu_layers) == (4096, "system", [], 8181, 0)
        assert s.n_threads >= 1 and s.sampling.temperature == s.sampling.temperature
        text = notice(services)
        for name in ("n_ctx", "n_threads", "temperature", "theme", "recent_models", "server_port", "n_gpu_layers"):
            assert name in text
        assert "max_tokens" not in text
    finally:
        services.shutdown()


def test_a_second_unreadable_settings_file_never_overwrites_the_first(qtbot, folders):
    _, config = folders
    for content in ("[1]", "[2]", "[3]"):
        (config / "settings.json").write_text(content)
        services = start(qtbot)
        services.instance.release()  # no shutdown: it would save good settings over the next bad file
        services.store.close()
    kept = sorted(p.read_text() for p in config.iterdir() if SETTINGS_ASIDE.search(p.name))
    assert kept == ["[1]", "[2]", "[3]"]


def test_text_in_the_database_that_is_not_utf8_reads_with_replacement_characters(qtbot, folders):
    # a hand-edited or foreign-written row: SQLite keeps the bytes, and Python's driver used to raise on
    # reading them, so the app did not start (issue 31, "Unicode in files")
    data, _ = folders
    db = data / "conversations.sqlite3"
    fill(db, conversations=2)
    raw = sqlite3.connect(str(db))
    raw.execute("UPDATE conversations SET title=CAST(X'5269766572ff' AS TEXT), "
                "system_prompt=CAST(X'4265ff' AS TEXT) WHERE title='chat 0'")
    raw.execute("UPDATE messages SET content=CAST(X'68c3' AS TEXT) WHERE id=1")
    raw.commit()
    raw.close()
    services = start(qtbot)
    try:
        titles = {c.title for c in services.store.list()}
        assert titles == {"River\ufffd", "chat 1"}
        bad = next(c for c in services.store.list() if c.title == "River\ufffd")
        assert bad.system_prompt == "Be\ufffd"
        assert services.store.messages(bad.id)[0].content == "h\ufffd"
        services.window.chat.open(bad.id)
        assert services.window.chat.transcript.messages[0].content == "h\ufffd"
        assert "River" in services.store.export_markdown(bad.id)
        assert notice(services) == ""  # the file is sound: nothing set aside
    finally:
        services.shutdown()
