"""Layouts that hold at 1000×700 and 1920×1080, measured on the real window (sizes, overlaps, scroll bars;
no pixel comparisons except the transcript's background): every page fits the window without pushing it
larger or scrolling sideways, the catalog shows several rows with their Download buttons, Eject keeps the
window and the chat list, status messages stop short of the fixed labels, and the dialogs' rows stay clear
of each other."""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import QPoint, QRect
from PySide6.QtWidgets import (
    QAbstractButton,
    QAbstractScrollArea,
    QAbstractSpinBox,
    QComboBox,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QProgressBar,
    QWidget,
)

from app.chat.chat_settings import ChatSettingsDialog
from app.load_choice import LoadChoice
from app.load_sheet import LoadSheet
from engine.store import catalog
from tests.app.conftest import start_and_load

SIZES = ((1000, 700), (1920, 1080))
LEAVES = (QLabel, QAbstractButton, QAbstractSpinBox, QProgressBar, QPlainTextEdit, QComboBox, QLineEdit)


def shown_leaves(root: QWidget) -> list[tuple[QWidget, QRect]]:
    """The visible controls and labels under ``root`` (not the parts of one, such as a spin box's line edit),
    with their rectangles in ``root``'s coordinates."""
    out = []
    for w in root.findChildren(QWidget):
        if not (isinstance(w, LEAVES) and w.isVisibleTo(root) and w.width() > 0 and w.height() > 0):
            continue
        parent, inside = w.parentWidget(), False
        while parent is not None and parent is not root:
            inside = inside or isinstance(parent, (*LEAVES, QAbstractScrollArea)) or not parent.isVisibleTo(root)
            parent = parent.parentWidget()
        if not inside:  # a cell widget (the catalog's buttons) is measured against its table instead
            out.append((w, QRect(w.mapTo(root, QPoint(0, 0)), w.size())))
    return out


def overlaps(root: QWidget) -> list[str]:
    leaves = shown_leaves(root)
    return [f"{type(a).__name__} {getattr(a, 'text', lambda: '')()!r} overlaps "
            f"{type(b).__name__} {getattr(b, 'text', lambda: '')()!r}"
            for i, (a, ra) in enumerate(leaves) for b, rb in leaves[i + 1:] if ra.intersects(rb)]


def sideways_scrolling(root: QWidget) -> list[str]:
    return [type(a).__name__ for a in root.findChildren(QAbstractScrollArea)
            if a.isVisibleTo(root) and a.horizontalScrollBar().isVisible()]


@pytest.fixture()
def window(qtbot, services):
    start_and_load(qtbot, services)
    w = services.window
    w.show()
    qtbot.waitExposed(w)
    return w


@pytest.mark.parametrize("size", SIZES)
def test_every_page_fits_the_window_with_nothing_scrolled_sideways_or_overlapping(qtbot, window, size):
    window.resize(*size)
    qtbot.wait(50)
    pages = window.models_page.sections
    for index in range(window.tabs.count()):
        window.tabs.setCurrentIndex(index)
        for section in range(pages.count()) if window.tabs.currentWidget() is window.models_page else (0,):
            pages.setCurrentIndex(section)
            qtbot.wait(50)
            page = window.tabs.currentWidget()
            where = f"{window.tabs.tabText(index)} / {pages.tabText(section)} at {size}"
            assert (window.width(), window.height()) == size, f"{where}: the page pushed the window larger"
            assert not sideways_scrolling(page), where
            assert not overlaps(page), (where, overlaps(page))


@pytest.mark.parametrize("size", SIZES)
def test_the_catalog_shows_several_rows_and_every_download_button_in_view(qtbot, window, size):
    window.resize(*size)
    window.tabs.setCurrentWidget(window.models_page)
    window.models_page.sections.setCurrentWidget(window.models_page.recommended)
    table = window.models_page.recommended.table
    qtbot.waitUntil(lambda: table.rowCount() == len(catalog.load()), timeout=10000)
    qtbot.wait(50)
    view = table.viewport().rect()
    buttons = [QRect(b.mapTo(table.viewport(), QPoint(0, 0)), b.size()) for b in window.models_page.recommended.buttons]
    assert all(view.left() <= r.left() and r.right() <= view.right() for r in buttons), "a button is cut off"
    assert sum(view.contains(r) for r in buttons) >= 4, "fewer than four catalog rows fit"
    assert all(b.fontMetrics().horizontalAdvance(b.text()) < b.width() for b in window.models_page.recommended.buttons)


def test_eject_keeps_the_window_size_and_the_chat_list_width(qtbot, window):
    window.resize(1000, 700)
    qtbot.wait(50)
    before, sidebar = window.size(), window.sidebar.width()
    with qtbot.waitSignal(window.client.sig_unloaded, timeout=30000):
        window.models.eject()
    qtbot.wait(50)
    reason = window.chat_pane.blocked_label
    assert reason.isVisibleTo(window) and "No model is loaded" in reason.text()
    assert window.size() == before and window.sidebar.width() == sidebar
    assert not overlaps(window.chat_pane)


def test_a_long_status_message_stops_short_of_the_fixed_labels(qtbot, window):
    window.resize(1000, 700)
    text = "The reply waiting for disk space is saved, and this message goes on long enough to reach the labels"
    window.statusBar().showMessage(text, 10000)
    qtbot.wait(50)
    bar = window.statusBar()
    shown, room = bar.shown_message(), bar.message_rect()
    assert bar.currentMessage() == text  # the message itself is whole
    assert shown.endswith("…") and bar.fontMetrics().horizontalAdvance(shown) <= room.width()
    first_label = min(w.x() for w in (window.server_status, window.engine_status))
    assert room.right() < first_label - 10
    bar.grab()  # painted: the tooltip holds the whole text
    assert bar.toolTip() == text


def test_the_chat_settings_system_prompt_stays_clear_of_ok(qtbot, services):
    dialog = ChatSettingsDialog(services.settings.reply_values(), "You are a helpful assistant. " * 6, 3)
    qtbot.addWidget(dialog)
    dialog.show()
    qtbot.waitExposed(dialog)
    assert not overlaps(dialog), overlaps(dialog)


def test_the_load_sheets_error_stays_clear_of_its_gpu_hint(qtbot, services, tmp_path: Path):
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"not a model" * 20)
    sheet = LoadSheet(LoadChoice(str(broken), None, 4096, 2, 0, True), "cpu", None, None)
    qtbot.addWidget(sheet)
    sheet.show()
    qtbot.waitUntil(lambda: "cannot be loaded" in sheet.memory_text.text(), timeout=10000)
    qtbot.wait(50)
    assert sheet.gpu_reason.isVisibleTo(sheet)
    assert not overlaps(sheet), overlaps(sheet)


def test_at_1920_the_transcript_margins_take_the_transcript_background(qtbot, window):
    window.resize(1920, 1080)
    qtbot.wait(50)
    view = window.transcript
    margin = view.viewportMargins().left()
    assert margin > 100  # the text column is centred
    image = view.grab().toImage()
    inside = image.pixelColor(margin + view.viewport().width() // 2, view.height() - 20)
    beside = image.pixelColor(margin // 2, view.height() // 2)
    assert beside == inside and beside != window.palette().window().color()
