"""The conversation list: a Qt item model over the store, the sidebar that
shows it, and the controller that acts on it (open, search, rename, delete,
export). The store stays plain Python; the model wraps it, never the reverse.

Chats that share a title are told apart by their date and model in the list.
Deleting asks first (a conversation cannot be brought back). Export starts in
the user's Documents folder and offers Markdown, JSON and plain text; the
chosen filter decides the format.

On a full disk nothing here raises: a new chat or a delete is refused with a
status-bar message that says to free space, and a rename asks again with
what was typed and why (the same for a title that is not valid text).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from enum import IntEnum
from pathlib import Path
from typing import Any

from PySide6.QtCore import (
    QAbstractListModel,
    QModelIndex,
    QObject,
    QPersistentModelIndex,
    QPoint,
    QStandardPaths,
    Qt,
    Signal,
)
from PySide6.QtWidgets import (
    QFileDialog,
    QInputDialog,
    QLineEdit,
    QListView,
    QMenu,
    QMessageBox,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.chat.controller import ChatController
from app.chat.reply_saver import refusal
from app.chat.store import Conversation, ConversationStore, NotSaved
from app.text_check import is_text, not_text_notice

Index = QModelIndex | QPersistentModelIndex
# export formats: the save dialog's filter -> the format, which is also the file's extension
EXPORT_FILTERS = {"Markdown (*.md)": "md", "JSON (*.json)": "json", "Text (*.txt)": "txt"}


class ModelRole(IntEnum):
    ID = Qt.ItemDataRole.UserRole + 1


class ConversationListModel(QAbstractListModel):
    """Conversations, newest first, optionally filtered by a search text."""

    def __init__(self, store: ConversationStore, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.store = store
        self._rows: list[Conversation] = []
        self._shared_titles: set[str] = set()  # titles more than one chat has: shown with date and model

    def rowCount(self, parent: Index = QModelIndex()) -> int:  # noqa: B008 (Qt's own default)
        return 0 if parent.isValid() else len(self._rows)

    def data(self, index: Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid() or not 0 <= index.row() < len(self._rows):
            return None
        conv = self._rows[index.row()]
        if role == Qt.ItemDataRole.DisplayRole:
            return self.label(conv)
        if role == Qt.ItemDataRole.ToolTipRole:
            return f"{conv.title}\n{_when(conv.updated)}" + (f" · {conv.model}" if conv.model else "")
        if role == ModelRole.ID:
            return conv.id
        return None

    def reload(self, search: str = "") -> None:
        self.beginResetModel()
        self._rows = self.store.list(search)
        counts = Counter(c.title for c in self.store.list())
        self._shared_titles = {title for title, n in counts.items() if n > 1}
        self.endResetModel()

    def label(self, conv: Conversation) -> str:
        """The title; with its date and model when another chat has the same title."""
        if conv.title not in self._shared_titles:
            return conv.title
        return f"{conv.title} · {_when(conv.updated)}" + (f" · {conv.model}" if conv.model else "")

    def row_of(self, conversation_id: int | None) -> int | None:
        return next((i for i, c in enumerate(self._rows) if c.id == conversation_id), None)


class ConversationSidebar(QWidget):
    """The view: a "new chat" button, a search box and the list."""

    def __init__(self, model: ConversationListModel, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.new_button = QPushButton("+  New chat")
        self.search = QLineEdit()
        self.search.setPlaceholderText("Search conversations")
        self.search.setClearButtonEnabled(True)
        self.list = QListView()
        self.list.setModel(model)
        self.list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.list.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.list.setEditTriggers(QListView.EditTrigger.NoEditTriggers)
        side = QVBoxLayout(self)
        side.setContentsMargins(8, 8, 4, 8)
        side.addWidget(self.new_button)
        side.addWidget(self.search)
        side.addWidget(self.list, 1)


class ConversationController(QObject):
    """Acts on the list: keeps it in step with the store and the open chat.

    Signals:
        sig_message(str, int): a status-bar message and how long to show it (ms).
        sig_opened(): a conversation was opened or created (focus the composer).
    """

    sig_message = Signal(str, int)
    sig_opened = Signal()

    def __init__(self, store: ConversationStore, chat: ChatController, sidebar: ConversationSidebar,
                 model: ConversationListModel) -> None:
        super().__init__(sidebar)
        self.store, self.chat, self.sidebar, self.model = store, chat, sidebar, model
        sidebar.new_button.clicked.connect(self.new_chat)
        sidebar.search.textChanged.connect(lambda _text: self.refresh())
        sidebar.list.clicked.connect(self._on_clicked)
        sidebar.list.customContextMenuRequested.connect(self._menu)
        chat.sig_reply_finished.connect(lambda _status: self.refresh())
        chat.sig_version_shown.connect(self.refresh)  # a branch brings its title (app/chat/versions.py)
        self._model_name = ""  # the loaded model, remembered with each chat it replies in
        if hasattr(chat.client, "sig_loaded"):
            chat.client.sig_loaded.connect(self._on_loaded)
        chat.sig_reply_started.connect(self._note_model)

    def open_latest(self) -> None:
        """Show the newest conversation, as the app does on start."""
        self.refresh()
        convs = self.store.list()
        if convs:
            self.chat.open(convs[0].id)
            self._select(convs[0].id)

    def refresh(self) -> None:
        self.model.reload(self.sidebar.search.text().strip())
        if self.chat.conversation_id is not None:
            self._select(self.chat.conversation_id)

    def new_chat(self) -> None:
        """Show an empty chat: the open one when nothing was written in it yet, else a new one.

        Reusing it keeps Ctrl+N pressed twice, or on a chat never used, from
        leaving a pile of empty "New chat" entries in the list.
        """
        if self.chat.busy:
            self.sig_message.emit("Stop the reply first to start a new chat.", 4000)
            return
        open_id = self.chat.conversation_id
        if open_id is None or self.store.messages(open_id):
            try:
                self.chat.new_conversation()
            except NotSaved as exc:
                self.sig_message.emit(refusal(exc, "no new chat was started. Free some space and try again."),
                                      10000)
                return
        if self.sidebar.search.text():
            self.sidebar.search.clear()  # a search would hide the new chat from the list
        self.refresh()
        self.sig_opened.emit()

    def ensure_conversation(self) -> int | None:
        """The open conversation's id, creating one if none is open; None (and a message) when the disk
        refused the new one."""
        if self.chat.conversation_id is None:
            try:
                self.chat.new_conversation()
            except NotSaved as exc:
                self.sig_message.emit(refusal(exc, "no chat could be started. Free some space and try again."),
                                      10000)
                return None
            self.refresh()
        return self.chat.conversation_id

    def rename(self, conv_id: int) -> None:
        """Ask for a title; one that cannot be stored is asked for again, as typed, with the reason."""
        title, why = self.store.get(conv_id).title, ""
        while True:
            title, ok = QInputDialog.getText(self.sidebar, "Rename conversation",
                                             f"{why}\n\nTitle:" if why else "Title:", text=title)
            if not ok or not title.strip():
                return
            if not is_text(title):
                why = not_text_notice("Title")
                continue
            try:
                self.store.update(conv_id, title=title.strip())
            except NotSaved as exc:
                why = refusal(exc, "the new title was not saved. Free some space and press OK again, or Cancel.")
                continue
            self.refresh()
            return

    def ask_delete(self, conv_id: int) -> None:
        """Delete after the user says yes: there is no bringing a conversation back."""
        if self.chat.busy and conv_id == self.chat.conversation_id:
            self.sig_message.emit("Stop the reply first to delete this conversation.", 4000)
            return
        title = self.store.get(conv_id).title
        answer = QMessageBox.question(
            self.sidebar, "Delete conversation",
            f"Delete “{title}” and all its messages? This cannot be undone.",
            QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No, QMessageBox.StandardButton.No)
        if answer == QMessageBox.StandardButton.Yes and self.delete(conv_id):
            self.sig_message.emit(f"Deleted “{title}”.", 4000)

    def delete(self, conv_id: int) -> bool:
        """Delete a conversation; False (with a message when the disk refused) when it is still there."""
        if self.chat.busy and conv_id == self.chat.conversation_id:
            return False
        try:
            self.store.delete(conv_id)
        except NotSaved as exc:
            title = self.store.get(conv_id).title
            self.sig_message.emit(refusal(exc, f"“{title}” was not deleted. Free some space and delete it again."),
                                  10000)
            return False
        if conv_id == self.chat.conversation_id:
            self.chat.close_conversation()
        self.refresh()
        return True

    def export(self, fmt: str, conv_id: int | None = None) -> None:
        conv_id = conv_id if conv_id is not None else self.chat.conversation_id
        if conv_id is None:
            return
        title = self.store.get(conv_id).title
        suggested = "".join(c if c.isalnum() or c in " -_" else "_" for c in title).strip() or "conversation"
        folder = QStandardPaths.writableLocation(QStandardPaths.StandardLocation.DocumentsLocation) or str(Path.home())
        wanted = next((f for f, ext in EXPORT_FILTERS.items() if ext == fmt), next(iter(EXPORT_FILTERS)))
        path, chosen = QFileDialog.getSaveFileName(self.sidebar, "Export conversation",
                                                   str(Path(folder) / f"{suggested}.{EXPORT_FILTERS[wanted]}"),
                                                   ";;".join(EXPORT_FILTERS), wanted)
        if not path:
            return
        fmt = EXPORT_FILTERS.get(chosen, fmt)
        target = Path(path) if Path(path).suffix else Path(path).with_suffix(f".{fmt}")
        if fmt == "json":
            text = json.dumps(self.store.export_json(conv_id), indent=2, ensure_ascii=False)
        else:
            text = self.store.export_text(conv_id) if fmt == "txt" else self.store.export_markdown(conv_id)
        try:
            target.write_text(text, encoding="utf-8")
        except OSError as exc:
            self.sig_message.emit(f"Could not export to {target}: {exc.strerror or exc}", 8000)
            return
        self.sig_message.emit(f"Exported to {target}", 5000)

    def _on_loaded(self, event: object) -> None:
        path = getattr(getattr(event, "model", None), "path", "") or ""
        self._model_name = Path(path).stem if path else ""

    def _note_model(self) -> None:
        if self._model_name and self.chat.conversation_id is not None:
            try:
                self.store.update(self.chat.conversation_id, model=self._model_name)
            except NotSaved:  # a label in the list; the chat's next reply writes it again
                pass

    def _select(self, conversation_id: int) -> None:
        row = self.model.row_of(conversation_id)
        if row is not None:
            self.sidebar.list.setCurrentIndex(self.model.index(row))

    def _on_clicked(self, index: QModelIndex) -> None:
        if self.chat.busy:
            self.sig_message.emit("Stop the reply first to switch conversations.", 4000)
            self._select(self.chat.conversation_id or -1)
            return
        self.chat.open(int(index.data(ModelRole.ID)))

    def _menu(self, pos: QPoint) -> None:
        index = self.sidebar.list.indexAt(pos)
        if not index.isValid():
            return
        conv_id = int(index.data(ModelRole.ID))
        menu = QMenu(self.sidebar)
        menu.addAction("Rename…", lambda: self.rename(conv_id))
        menu.addAction("Export…", lambda: self.export("md", conv_id))
        menu.addSeparator()
        menu.addAction("Delete…", lambda: self.ask_delete(conv_id))
        menu.exec(self.sidebar.list.mapToGlobal(pos))
        # the right click made that row current; the transcript still shows the open chat, so the list does too
        if self.chat.conversation_id is not None:
            self._select(self.chat.conversation_id)


def _when(timestamp: float) -> str:
    """A short local date: "30 Nov 14:02" this year, "30 Nov 2025" before."""
    t = time.localtime(timestamp)
    return time.strftime("%d %b %H:%M" if t.tm_year == time.localtime().tm_year else "%d %b %Y", t)
