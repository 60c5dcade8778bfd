"""An image in the chat opens full size: a click on its thumbnail in the transcript (a chat opened from the
database, as after a restart) or in the attach strip shows it in a viewer at its own pixel size, or fitted to
the screen keeping its aspect ratio; the caption says its size; Esc closes it; Tab and Enter open it too.
Measured on the widgets, not
compared pixel by pixel."""

from __future__ import annotations

from PySide6.QtCore import QPoint, Qt
from PySide6.QtGui import QGuiApplication, QImage, QTextCursor
from PySide6.QtWidgets import QApplication

from app.chat import image_input
from app.chat.attach_strip import AttachStrip
from app.chat.attachments import Attachment
from app.chat.controller import ChatController
from app.chat.image_viewer import ImageViewer
from app.chat.stats_panel import StatsPanel
from app.chat.store import ConversationStore
from app.chat.transcript import TranscriptView
from app.engine_client import EngineClient
from app.settings import Settings
from app.theme import LIGHT
from engine.synth.images import BLACK, BLUE, GREEN, RED, WHITE, YELLOW, field_png

QUADRANTS = field_png([[RED, GREEN], [BLUE, YELLOW]], width=160, height=120)  # larger than a 96 px thumbnail
STRIPES = field_png([[BLACK, WHITE, BLACK, WHITE]], width=48, height=32)


def _viewers() -> list[ImageViewer]:
    return [w for w in QApplication.topLevelWidgets() if isinstance(w, ImageViewer) and w.isVisible()]


def _thumbnail_points(transcript: TranscriptView) -> list[QPoint]:
    """Where each image of the transcript is drawn, in the viewport's coordinates (the middle of each)."""
    points = []
    block = transcript.document().begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            fragment = it.fragment()
            if fragment.charFormat().isImageFormat():
                image = fragment.charFormat().toImageFormat()
                cursor = QTextCursor(transcript.document())
                cursor.setPosition(fragment.position())
                rect = transcript.cursorRect(cursor)
                points.append(QPoint(rect.x() + int(image.width()) // 2, rect.bottom() - int(image.height()) // 2))
            it += 1
        block = block.next()
    return points


def _close_with_escape(qtbot, viewer: ImageViewer) -> None:
    with qtbot.waitSignal(viewer.finished, timeout=3000):
        qtbot.keyClick(viewer, Qt.Key.Key_Escape)
    assert _viewers() == []


def test_a_click_on_a_stored_thumbnail_opens_the_image_at_its_size_and_escape_closes_it(qtbot, tmp_path):
    path = tmp_path / "c.sqlite3"
    store = ConversationStore(path)
    a, b = Attachment.of(QUADRANTS), Attachment.of(STRIPES)
    conv = store.create().id
    _user, reply = store.add_turn(conv, "What are these?", images=(a, b))
    store.update_message(reply.id, content="Colours.", status="complete")
    store.close()

    again = ConversationStore(path)  # the next start: the images come from the database
    transcript = TranscriptView(LIGHT)
    qtbot.addWidget(transcript)
    try:
        ChatController(again, EngineClient(), transcript, StatsPanel(LIGHT), Settings()).open(conv)
        transcript.resize(700, 500)
        transcript.show()
        qtbot.waitExposed(transcript)
        assert image_input.thumbnail(a).size() != QImage.fromData(QUADRANTS).size()  # a viewer must enlarge it
        points = _thumbnail_points(transcript)
        assert len(points) == 2
        assert [transcript.anchorAt(p) for p in points] == ["image:0:0", "image:0:1"]
        for point, source, name in ((points[0], QUADRANTS, "Image 1 of 2"), (points[1], STRIPES, "Image 2 of 2")):
            qtbot.mouseClick(transcript.viewport(), Qt.MouseButton.LeftButton, pos=point)
            qtbot.waitUntil(lambda: len(_viewers()) == 1, timeout=3000)
            viewer = _viewers()[0]
            size = QImage.fromData(source).size()
            assert viewer.image_size == size
            assert viewer.picture.pixmap().size() == size  # full size, not the thumbnail
            assert viewer.picture.width() >= size.width() and viewer.picture.height() >= size.height()
            assert f"{name} · {size.width()} × {size.height()} px · PNG" in viewer.caption.text()
            assert viewer.windowTitle().startswith(name)
            _close_with_escape(qtbot, viewer)
        # by keyboard: Tab reaches the first thumbnail's link (the first link in the transcript), Enter opens it
        transcript.activateWindow()
        transcript.setFocus()
        qtbot.keyClick(transcript, Qt.Key.Key_Tab)
        assert transcript.textCursor().charFormat().anchorHref() == "image:0:0"  # the thumbnail, selected
        qtbot.keyClick(transcript, Qt.Key.Key_Return)
        qtbot.waitUntil(lambda: len(_viewers()) == 1, timeout=3000)
        assert _viewers()[0].image_size == QImage.fromData(QUADRANTS).size()
        _close_with_escape(qtbot, _viewers()[0])
    finally:
        again.close()


def test_a_large_image_is_scaled_down_to_the_screen_keeping_its_aspect_ratio(qtbot):
    free = QGuiApplication.primaryScreen().availableGeometry().size()
    wide = QImage(free.width() * 3, free.height(), QImage.Format.Format_RGB32)
    wide.fill(Qt.GlobalColor.darkCyan)
    strip = AttachStrip(LIGHT)
    qtbot.addWidget(strip)
    strip.set_refusal("")
    assert strip.add([image_input.from_qimage(wide)])
    strip.show()
    attached = QImage.fromData(strip.images[0].data).size()  # as attached: at most MAX_SIDE on its long side
    view = next(b for b in strip.findChildren(type(strip.attach_button)) if b.accessibleName() == "View attached "
                                                                                                 "image 1")
    qtbot.mouseClick(view, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: len(_viewers()) == 1, timeout=3000)
    viewer = _viewers()[0]
    shown = viewer.picture.pixmap().size()
    assert viewer.image_size == attached
    assert shown.width() <= free.width() and shown.height() <= free.height() and shown != attached
    assert abs(shown.width() / shown.height() - attached.width() / attached.height()) < 0.05
    assert f"{attached.width()} × {attached.height()} px" in viewer.caption.text() and "shown at" in \
        viewer.caption.text()
    assert viewer.frameGeometry().width() <= free.width() and viewer.frameGeometry().height() <= free.height()
    _close_with_escape(qtbot, viewer)
    assert len(strip.images) == 1  # viewing took nothing off
    remove = next(b for b in strip.findChildren(type(strip.attach_button)) if b.accessibleName() == "Remove "
                                                                                                   "attached image 1")
    remove.click()
    assert strip.images == []
