"""Images in the chat: attached (button, paste, drop), stored with the conversation, sent to the real
worker with their markers, shown as thumbnails before and after a restart; refused with the reason
on a model without a vision projector; databases from before images open and gain them."""

from __future__ import annotations

import shutil

import pytest
from PySide6.QtCore import QMimeData, Qt, QUrl
from PySide6.QtGui import QImage
from PySide6.QtWidgets import QFileDialog

from app.chat import image_input
from app.chat.attach_strip import NO_PROJECTOR
from app.chat.attachments import Attachment
from app.chat.context_fit import Turn
from app.chat.controller import ChatController
from app.chat.image_request import TYPED_MARKER, with_images
from app.chat.stats_panel import StatsPanel
from app.chat.store import ConversationStore
from app.chat.transcript import TranscriptView
from app.engine_client import EngineClient
from app.models.library_rows import label
from app.settings import Settings
from app.theme import LIGHT
from engine.synth import SynthModel, SynthSpec
from engine.synth.images import BLACK, BLUE, GREEN, RED, WHITE, YELLOW, field_png
from engine.synth.projector import ProjectorSpec, projector_path
from engine.worker.protocol import IMAGE_MARKER
from tests.app.conftest import start_and_load, write_database
from tests.app.test_image_viewer import _close_with_escape, _thumbnail_points, _viewers

QUADRANTS = field_png([[RED, GREEN], [BLUE, YELLOW]])
STRIPES = field_png([[BLACK, WHITE, BLACK, WHITE]], width=48, height=32)
SPEC = SynthSpec(arch="qwen35", weights="random", seed=1)


@pytest.fixture(scope="module")
def vision_files() -> tuple[str, str]:
    return str(SynthModel(SPEC).path("combined")), str(projector_path(ProjectorSpec(target=SPEC)))


# -- the store -------------------------------------------------------------------------------
def test_a_turns_images_are_stored_once_by_hash_and_read_back_in_order(tmp_path):
    store = ConversationStore(tmp_path / "c.sqlite3")
    try:
        conv = store.create().id
        a, b = Attachment.of(QUADRANTS), Attachment.of(STRIPES)
        user, reply = store.add_turn(conv, "What are these?", images=(a, b, a))
        assert user.images == (a.hash, b.hash, a.hash) and reply.images == ()
        assert store.image(a.hash) == a and store.image(b.hash).mime == "image/png"
        assert store.db.execute("SELECT COUNT(*) FROM images").fetchone()[0] == 2
        assert store.messages(conv)[0].images == (a.hash, b.hash, a.hash)
    finally:
        store.close()


def test_an_edit_keeps_each_versions_images_and_deleting_the_chat_drops_them(tmp_path):
    store = ConversationStore(tmp_path / "c.sqlite3")
    try:
        conv = store.create().id
        a, b = Attachment.of(QUADRANTS), Attachment.of(STRIPES)
        user, reply = store.add_turn(conv, "first", images=(a,))
        store.update_message(reply.id, content="an answer", status="complete")
        edited, _ = store.branch(user.id, "second", images=(b,))
        assert edited.images == (b.hash,)
        assert store.select_version(user.id, 0).images == (a.hash,)  # the old branch with its image
        assert [m.content for m in store.messages(conv)] == ["first", "an answer"]
        assert store.select_version(user.id, 1).images == (b.hash,)
        other = store.create().id
        store.add_turn(other, "kept", images=(b,))
        store.delete(conv)
        assert store.image(a.hash) is None  # named by nothing left
        assert store.image(b.hash) == b  # the other chat still shows it
    finally:
        store.close()


def test_a_fork_keeps_the_images_and_a_deleted_message_keeps_its_own_until_it_is_gone(qtbot, tmp_path):
    from app.chat.message_actions import Deletions, fork

    store = ConversationStore(tmp_path / "c.sqlite3")
    try:
        conv = store.create().id
        a, b = Attachment.of(QUADRANTS), Attachment.of(STRIPES)
        first, _ = store.add_turn(conv, "first", images=(a,))
        second, _ = store.add_turn(conv, "second", images=(b,))
        forked = fork(store, first.id)
        assert [m.images for m in store.messages(forked)] == [(a.hash,)]
        Deletions(store).delete(second.id)  # undoable: the row is kept aside with its image's name
        store.delete(forked)
        store.delete(store.create().id)  # prunes
        assert store.image(a.hash) == a and store.image(b.hash) == b
    finally:
        store.close()


V2_SCHEMA = """
CREATE TABLE conversations (id INTEGER PRIMARY KEY, title TEXT NOT NULL, system_prompt TEXT NOT NULL DEFAULT '',
    settings TEXT NOT NULL DEFAULT '{}', created REAL NOT NULL, updated REAL NOT NULL,
    model TEXT NOT NULL DEFAULT '');
CREATE TABLE messages (id INTEGER PRIMARY KEY,
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE, role TEXT NOT NULL,
    content TEXT NOT NULL, status TEXT NOT NULL DEFAULT 'complete', stats TEXT, created REAL NOT NULL,
    versions TEXT NOT NULL DEFAULT '[]', version INTEGER NOT NULL DEFAULT 0);
INSERT INTO conversations VALUES (1, 'Before images', '', '{}', 1.0, 2.0, 'm.gguf');
INSERT INTO messages VALUES (1, 1, 'user', 'hi', 'complete', NULL, 1.0, '[]', 0);
INSERT INTO messages VALUES (2, 1, 'assistant', 'hello', 'complete', NULL, 1.5, '[]', 0);
PRAGMA user_version=2;
"""


def test_a_database_from_before_images_opens_and_takes_them(tmp_path):
    path = tmp_path / "v2.sqlite3"
    write_database(path, V2_SCHEMA)
    store = ConversationStore(path)
    try:
        assert [(m.content, m.images) for m in store.messages(1)] == [("hi", ()), ("hello", ())]
        user, _ = store.add_turn(1, "and this?", images=(Attachment.of(QUADRANTS),))
        assert store.message(user.id).images == (Attachment.of(QUADRANTS).hash,)
        assert store.db.execute("PRAGMA user_version").fetchone()[0] == 3
    finally:
        store.close()


def test_a_damaged_images_column_spoils_only_that_message(tmp_path):
    store = ConversationStore(tmp_path / "c.sqlite3")
    try:
        conv = store.create().id
        user, _ = store.add_turn(conv, "hi")
        store.db.execute("UPDATE messages SET images='{not json' WHERE id=?", (user.id,))
        assert store.message(user.id).images == ()
        store.db.execute("UPDATE messages SET images='[\"no-such-hash\", 3]' WHERE id=?", (user.id,))
        assert store.message(user.id).images == ("no-such-hash",) and store.image("no-such-hash") is None
    finally:
        store.close()


# -- the request -----------------------------------------------------------------------------
def test_each_kept_image_becomes_a_marker_before_its_messages_text(tmp_path):
    store = ConversationStore(tmp_path / "c.sqlite3")
    try:
        conv = store.create().id
        a, b = Attachment.of(QUADRANTS), Attachment.of(STRIPES)
        first, _ = store.add_turn(conv, f"old {IMAGE_MARKER} typed", images=(a,))
        second, _ = store.add_turn(conv, "new", images=(b, a))
        turn = Turn("Be brief.", [store.message(first.id), store.message(second.id)])
        asked = with_images(turn, store.image, vision=True)
        assert [m["content"] for m in asked.messages] == [
            "Be brief.", f"{IMAGE_MARKER}\nold {TYPED_MARKER} typed", f"{IMAGE_MARKER}\n{IMAGE_MARKER}\nnew"]
        assert asked.images == [a.base64(), b.base64(), a.base64()] and asked.left_out == 0
        turn.dropped = 1  # the oldest message left out to fit: its image with it
        assert with_images(turn, store.image, vision=True).images == [b.base64(), a.base64()]
        text_only = with_images(turn, store.image, vision=False)
        assert text_only.images == [] and text_only.left_out == 2 and text_only.messages[-1]["content"] == "new"
    finally:
        store.close()


def test_images_are_kept_as_mtmd_reads_them_and_others_become_png(qtbot, tmp_path):
    assert image_input.from_bytes(QUADRANTS).data == QUADRANTS
    webp = tmp_path / "field.webp"
    QImage.fromData(QUADRANTS).save(str(webp))
    if webp.exists():  # Qt's WebP plugin is there
        assert image_input.from_file(webp).mime == "image/png"
    big = QImage(5000, 100, QImage.Format.Format_RGB32)
    big.fill(0x336699)
    scaled = QImage.fromData(image_input.from_qimage(big).data)
    assert (scaled.width(), scaled.height()) == (image_input.MAX_SIDE, 40)
    (tmp_path / "notes.png").write_text("not an image")
    with pytest.raises(image_input.ImageRefused, match="notes.png is not an image"):
        image_input.from_file(tmp_path / "notes.png")


# -- the app, with the real worker -------------------------------------------------------------
def _mime_with_file(path) -> QMimeData:
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(path))])
    return mime


def _ask(qtbot, window, text: str) -> str:
    with qtbot.waitSignal(window.chat.sig_reply_finished, timeout=120000) as finished:
        window.composer.setPlainText(text)
        window.send()
    assert finished.args == ["complete"]
    return window.transcript.messages[-1].content


def test_attached_images_reach_the_model_and_come_back_after_a_restart(qtbot, services, vision_files, tmp_path,
                                                                      monkeypatch):
    services.settings.model_path, services.settings.mmproj_path = vision_files
    services.settings.speculative = "off"
    services.settings.max_tokens = 12
    start_and_load(qtbot, services)
    window = services.window
    pane = window.chat_pane
    assert pane.attachments.attach_button.isEnabled()

    # a paste: pixels on the clipboard
    pasted = QMimeData()
    pasted.setImageData(QImage.fromData(QUADRANTS))
    assert pane.composer.canInsertFromMimeData(pasted)
    pane.composer.insertFromMimeData(pasted)
    assert len(pane.attachments.images) == 1 and pane.attachments.isVisible()
    assert window.composer.toPlainText() == ""  # attached, not pasted as text
    assert pane.grab().save(str(tmp_path / "attached_before_sending.png"))
    first = _ask(qtbot, window, "It shows")
    assert pane.attachments.images == [] and not pane.attachments.isVisible()
    conv = window.chat.conversation_id
    shown = window.transcript.messages[-2]
    assert shown.role == "user" and len(shown.images) == 1
    assert QImage.fromData(shown.images[0].data).pixel(4, 4) == QImage.fromData(QUADRANTS).pixel(4, 4)
    window.show()  # its thumbnail in the live transcript opens the image full size (tests/app/test_image_viewer.py)
    qtbot.waitExposed(window)
    thumb = _thumbnail_points(window.transcript)[0]
    qtbot.mouseClick(window.transcript.viewport(), Qt.MouseButton.LeftButton, pos=thumb)
    qtbot.waitUntil(lambda: len(_viewers()) == 1, timeout=3000)
    assert _viewers()[0].picture.pixmap().size() == QImage.fromData(QUADRANTS).size()
    _close_with_escape(qtbot, _viewers()[0])

    # the same words with another image, dropped as a file into a new chat, then the first one by the button
    window.chat.new_conversation()
    stripes = tmp_path / "stripes.png"
    stripes.write_bytes(STRIPES)
    pane.composer.insertFromMimeData(_mime_with_file(stripes))
    second = _ask(qtbot, window, "It shows")
    assert first and second and first != second  # the image reached the model

    window.chat.new_conversation()
    quadrants = tmp_path / "quadrants.png"
    quadrants.write_bytes(QUADRANTS)
    monkeypatch.setattr(QFileDialog, "getOpenFileNames", lambda *_a, **_k: ([str(quadrants)], ""))
    pane.attachments.attach_button.click()
    assert _ask(qtbot, window, "It shows") == first  # greedy: the same image, the same reply

    grab = window.grab()
    assert grab.save(str(tmp_path / "chat_with_image.png"))
    services.client.stop()
    services.store.close()

    # the next start: a new store, controller and transcript on the same database
    again = ConversationStore(services.store.path)
    transcript = TranscriptView(LIGHT)
    qtbot.addWidget(transcript)
    try:
        ChatController(again, EngineClient(), transcript, StatsPanel(LIGHT), Settings()).open(conv)
        user = transcript.messages[0]
        assert user.content == "It shows" and len(user.images) == 1  # the paste, as Qt encoded its pixels
        assert QImage.fromData(user.images[0].data) == QImage.fromData(QUADRANTS).convertToFormat(
            QImage.fromData(user.images[0].data).format())
        assert f"thumb:{user.images[0].hash}" in transcript.toHtml()
        thumb = transcript.loadResource(0, QUrl(f"thumb:{user.images[0].hash}"))
        assert thumb.pixel(4, 4) == QImage.fromData(QUADRANTS).pixel(4, 4)
        transcript.resize(500, 300)
        assert transcript.grab().save(str(tmp_path / "transcript_after_restart.png"))
    finally:
        again.close()
        services.store = ConversationStore(services.store.path)  # the fixture closes it


def test_without_a_projector_attach_is_disabled_and_a_pasted_image_is_refused(qtbot, services):
    messages: list[str] = []
    start_and_load(qtbot, services)  # the built-in model: no projector
    pane = services.window.chat_pane
    pane.sig_message.connect(lambda text, _ms: messages.append(text))
    button = pane.attachments.attach_button
    assert not button.isEnabled() and button.toolTip() == NO_PROJECTOR
    assert "Models → pair panel" in NO_PROJECTOR
    pasted = QMimeData()
    pasted.setImageData(QImage.fromData(QUADRANTS))
    pane.composer.insertFromMimeData(pasted)
    assert pane.attachments.images == [] and messages == [NO_PROJECTOR]


# -- the load sheet ----------------------------------------------------------------------------
def test_the_load_sheet_offers_the_projector_beside_the_model_with_its_memory_and_loads_it(
        qtbot, services, vision_files, default_model, monkeypatch):
    model, mmproj = vision_files
    start_and_load(qtbot, services)  # the built-in model: no projector
    sheet = services.window.models.open_sheet(model)
    qtbot.waitUntil(lambda: sheet.plan is not None and sheet.plan.projector > 0, timeout=30000)
    fitting = [o.path for o in sheet.facts.projectors if o.fits]
    assert mmproj in fitting and sheet.mmproj == fitting[0] == sheet.current_choice().mmproj  # proposed: it fits
    assert "fits combined.gguf" in sheet.projector.toolTip()
    assert "vision projector" in sheet.memory_text.text() and "vision projector" in sheet.memory_text.toolTip()
    with_projector = sheet.plan.ram_need
    sheet.set_projector(None)
    qtbot.waitUntil(lambda: sheet.plan is not None and sheet.plan.projector == 0, timeout=30000)
    assert sheet.current_choice().mmproj is None and sheet.plan.ram_need < with_projector
    # another file: checked against the model before it is offered
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *_a, **_k: (str(default_model), ""))
    sheet._projector_chosen(sheet.projector.findData("\0choose"))
    qtbot.waitUntil(lambda: str(default_model) in sheet.projector.options, timeout=30000)
    assert not sheet.projector.options[str(default_model)].fits
    assert "does not fit" in sheet.projector.currentText()
    sheet.set_projector(mmproj)
    with qtbot.waitSignal(services.client.sig_loaded, timeout=60000) as loaded:
        sheet.load_button.click()
    assert loaded.args[0].model.vision and loaded.args[0].model.mmproj == mmproj
    assert services.settings.mmproj_path == mmproj
    assert services.window.chat_pane.attachments.attach_button.isEnabled()
    again = services.window.models.open_sheet(model)  # the same model: its projector kept, not proposed
    qtbot.waitUntil(lambda: again.facts is not None, timeout=30000)
    assert again.mmproj == mmproj
    again.close()


# -- the library and the pair panel --------------------------------------------------------------
def test_the_library_names_a_models_projector_and_the_pair_loads_it_in_the_chat(qtbot, services, vision_files,
                                                                                 tmp_path, monkeypatch):
    model, mmproj = vision_files
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    folder = tmp_path / "data" / "models" / "local"  # the app's models folder (services' data folder)
    folder.mkdir(parents=True)
    shutil.copy(model, folder / "Vision-Q8_0.gguf")
    shutil.copy(mmproj, folder / "mmproj-Vision-F16.gguf")
    shutil.copy(model, folder / "Text-Q8_0.gguf")
    (tmp_path / "elsewhere").mkdir()
    shutil.copy(model, tmp_path / "elsewhere" / "Alone-Q8_0.gguf")
    start_and_load(qtbot, services)
    page = services.window.models_page
    view = page.library
    page.refresh_library()
    qtbot.waitUntil(lambda: view.row_for(str(folder / "Vision-Q8_0.gguf")) is not None, timeout=30000)
    row = view.row_for(str(folder / "Vision-Q8_0.gguf"))
    assert row.projector == str(folder / "mmproj-Vision-F16.gguf")
    assert "vision: mmproj-Vision-F16.gguf" in label(row)
    assert all("mmproj" not in r.name for r in view.rows_shown())  # a projector is never listed as a model
    view.search.setText("vision")
    assert {r.name for r in view.rows_shown()} == {"Vision-Q8_0.gguf", "Text-Q8_0.gguf"}  # both beside it
    view.search.clear()

    page.pair.set_pair(str(folder / "Vision-Q8_0.gguf"), None)
    assert "Projector: mmproj-Vision-F16.gguf" in page.pair.label.text()
    with qtbot.waitSignal(services.client.sig_loaded, timeout=60000) as loaded:
        page.pair.use_button.click()
    assert loaded.args[0].model.vision and loaded.args[0].model.mmproj == str(folder / "mmproj-Vision-F16.gguf")
    assert services.window.chat_pane.attachments.attach_button.isEnabled()
    with qtbot.waitSignal(services.client.sig_loaded, timeout=60000) as loaded:
        services.window.models.use(str(tmp_path / "elsewhere" / "Alone-Q8_0.gguf"), None)
    assert not loaded.args[0].model.vision  # another model never keeps this one's projector
    assert not services.window.chat_pane.attachments.attach_button.isEnabled()
