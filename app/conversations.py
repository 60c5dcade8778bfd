"""The conversation list: a Qt item model over the store, the sidebar that
shows it, and the controller that acts on it (open, search, rename, delete,
export). The store stays plain Python; the model wraps it, never the reverse.
"""

from __future__ import annotations

import json
from enum import IntEnum
from pathlib import Path
from typing import Any

from PySide6.QtCore import QAbstractListModel, QModelIndex, QObject, QPersistentModelIndex, QPoint, Qt, Signal
from PySide6.QtWidgets import QFileDialog, QInputDialog, QLineEdit, QListView, QMenu, QPushButton, QVBoxLayout, QWidget

from app.chat.controller import ChatController
from app.chat.store import Conversation, ConversationStore

Index = QModelIndex | QPersistentModelIndex


class ModelRole(IntEnum):
    ID = Qt.ItemDataRole.UserRole + 1


class ConversationListModel(QAbstractListModel):
    """Conversations, newest first, optionally filtered by a search text."""

    def __init__(self, store: ConversationStore, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.store = store
        self._rows: list[Conversation] = []

    def rowCount(self, parent: Index = QModelIndex()) -> int:  # noqa: B008 (Qt's own default)
        return 0 if parent.isValid() else len(self._rows)

    def data(self, index: Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid() or not 0 <= index.row() < len(self._rows):
            return None
        conv = self._rows[index.row()]
        if role in (Qt.ItemDataRole.DisplayRole, Qt.ItemDataRole.ToolTipRole):
            return conv.title
        if role == ModelRole.ID:
            return conv.id
        return None

    def reload(self, search: str = "") -> None:
        self.beginResetModel()
        self._rows = self.store.list(search)
        self.endResetModel()

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
        if self.chat.busy:
            return
        self.chat.new_conversation()
        self.refresh()
        self.sig_opened.emit()

    def ensure_conversation(self) -> int:
        """The open conversation's id, creating one if none is open."""
        if self.chat.conversation_id is None:
            self.chat.new_conversation()
            self.refresh()
        assert self.chat.conversation_id is not None
        return self.chat.conversation_id

    def rename(self, conv_id: int) -> None:
        title, ok = QInputDialog.getText(self.sidebar, "Rename conversation", "Title:",
                                         text=self.store.get(conv_id).title)
        if ok and title.strip():
            self.store.update(conv_id, title=title.strip())
            self.refresh()

    def delete(self, conv_id: int) -> None:
        if self.chat.busy and conv_id == self.chat.conversation_id:
            return
        self.store.delete(conv_id)
        if conv_id == self.chat.conversation_id:
            self.chat.close_conversation()
        self.refresh()

    def export(self, fmt: str, conv_id: int | None = None) -> None:
        conv_id = conv_id if conv_id is not None else self.chat.conversation_id
        if conv_id is None:
            return
        title = self.store.get(conv_id).title
        suggested = "".join(c if c.isalnum() or c in " -_" else "_" for c in title).strip() or "conversation"
        path, _ = QFileDialog.getSaveFileName(self.sidebar, "Export conversation", f"{suggested}.{fmt}")
        if not path:
            return
        text = (self.store.export_markdown(conv_id) if fmt == "md"
                else json.dumps(self.store.export_json(conv_id), indent=2, ensure_ascii=False))
        Path(path).write_text(text, encoding="utf-8")
        self.sig_message.emit(f"Exported to {path}", 5000)

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
        menu.addAction("Export as Markdown…", lambda: self.export("md", conv_id))
        menu.addAction("Export as JSON…", lambda: self.export("json", conv_id))
        menu.addSeparator()
        menu.addAction("Delete", lambda: self.delete(conv_id))
        menu.exec(self.sidebar.list.mapToGlobal(pos))
