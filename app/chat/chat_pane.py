"""The middle of the chat page: the transcript, the input box and the reply
buttons, wired to the chat controller.

Send and Regenerate are disabled, with the reason beside them, while no model
can answer (the engine starting or loading, nothing loaded): a request then
would only store an empty "failed" reply. Regenerate and Edit are also
disabled while the chat has no message of the user's: there is nothing to
ask again or to edit, and a button that does nothing reads as broken.

Tab and Shift+Tab leave the input box (keyboard users could not get out of
it); Ctrl+Tab puts a tab character in it for whoever wants one.

Images go with a message through the Attach button beside the input box, or
pasted or dropped into it (``app/chat/attach_strip.py``), when the loaded
model has a vision projector.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import pairwise

from PySide6.QtCore import QEvent, QMimeData, Qt, Signal
from PySide6.QtGui import QDragEnterEvent, QDropEvent, QKeyEvent
from PySide6.QtWidgets import QHBoxLayout, QLabel, QPlainTextEdit, QPushButton, QVBoxLayout, QWidget

from app.chat import image_input
from app.chat.attach_strip import NO_MODEL, NO_PROJECTOR, AttachStrip
from app.chat.context_bar import ContextBar
from app.chat.controller import ChatController
from app.chat.editing import EditBar
from app.chat.store import Message
from app.chat.transcript import TranscriptView
from app.theme import Palette
from engine.worker.events import ModelInfo


def _is_ctrl_tab(event: QKeyEvent) -> bool:
    return event.key() == Qt.Key.Key_Tab and event.modifiers() == Qt.KeyboardModifier.ControlModifier


class Composer(QPlainTextEdit):
    """The input box: Enter sends, Shift+Enter starts a new line, Tab and
    Shift+Tab move the focus, Ctrl+Tab types a tab.

    Signals:
        sig_submit(): the user pressed Enter.
        sig_images(list, list): images pasted or dropped (Attachments), and why others were refused.
    """

    sig_submit = Signal()
    sig_images = Signal(list, list)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setTabChangesFocus(True)

    def event(self, event: QEvent) -> bool:
        # Ctrl+Tab is the window's next-page shortcut everywhere else; here the box claims it
        if event.type() == QEvent.Type.ShortcutOverride and isinstance(event, QKeyEvent) and _is_ctrl_tab(event):
            event.accept()
            return True
        return super().event(event)

    def keyPressEvent(self, event: QKeyEvent) -> None:
        if _is_ctrl_tab(event):
            self.insertPlainText("\t")
            return
        if event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter) and not (
            event.modifiers() & Qt.KeyboardModifier.ShiftModifier
        ):
            self.sig_submit.emit()
            return
        super().keyPressEvent(event)

    def canInsertFromMimeData(self, source: QMimeData) -> bool:
        return image_input.carries_image(source) or super().canInsertFromMimeData(source)

    def insertFromMimeData(self, source: QMimeData) -> None:
        """A pasted or dropped image is attached, never inserted as text (its file name or nothing)."""
        if not image_input.carries_image(source):
            super().insertFromMimeData(source)
            return
        found, refused = image_input.from_mime(source)
        self.sig_images.emit(found, refused)


class ChatPane(QWidget):
    """Transcript, composer and buttons; ``above`` widgets (banners, notices) go on top.

    Signals:
        sig_message(str, int): a status-bar message and how long to show it (ms).
        sig_sent(): a message was sent (the conversation list changed).
    """

    sig_message = Signal(str, int)
    sig_sent = Signal()

    def __init__(self, chat: ChatController, transcript: TranscriptView, blocked_reason: Callable[[], str],
                 palette: Palette, above: list[QWidget], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.chat = chat
        self.blocked_reason = blocked_reason  # why no reply can be asked for now ("" when one can)
        self._replying = False
        self.blocked_label = QLabel()
        self.blocked_label.setStyleSheet(f"color:{palette.muted};")
        # on a line of its own above the buttons, wrapped: beside them, as one long line, it widened the window
        # and squeezed the chat list (Model → Eject)
        self.blocked_label.setWordWrap(True)
        self.blocked_label.setAlignment(Qt.AlignmentFlag.AlignRight)
        self.blocked_label.hide()
        self.model_notice = QLabel()
        self.model_notice.setWordWrap(True)
        self.model_notice.setStyleSheet(f"color:{palette.muted}; padding:2px 4px;")
        self.model_notice.hide()
        # what the last reply left out to fit the context: beside the composer, where the next message is typed
        self.context_notice = QLabel()
        self.context_notice.setWordWrap(True)
        self.context_notice.setStyleSheet(f"color:{palette.muted}; padding:2px 4px;")
        self.context_notice.hide()
        # a reply the disk would not take: stays until it is saved, so the user knows to free space
        self.save_notice = QLabel()
        self.save_notice.setWordWrap(True)
        self.save_notice.setStyleSheet(f"color:{palette.bad}; padding:2px 4px;")
        self.save_notice.hide()
        self.composer = Composer()
        self.composer.setPlaceholderText("Message the model — Enter sends, Shift+Enter for a new line")
        self.composer.setFixedHeight(84)
        self.attachments = AttachStrip(palette)
        self.send_button = QPushButton("Send")
        self.send_button.setDefault(True)
        self.stop_button = QPushButton("Stop")
        self.stop_button.setEnabled(False)
        self.regen_button = QPushButton("Regenerate")
        self.edit_button = QPushButton("Edit last")
        self.continue_button = QPushButton("Continue")
        self.continue_button.setToolTip("Generate more of the last reply, from where Stop or the length limit "
                                        "ended it")
        buttons = QHBoxLayout()
        buttons.addWidget(self.regen_button)
        buttons.addWidget(self.edit_button)
        buttons.addWidget(self.continue_button)
        buttons.addStretch(1)
        buttons.addWidget(self.stop_button)
        buttons.addWidget(self.send_button)
        # the style's minimum push button (80 px) made this row alone 428 px wide with Continue shown, and the
        # window wider than an 800 px screen; squeezed that far, a label may clip, at any usual size it does not
        for button in (self.regen_button, self.edit_button, self.continue_button, self.stop_button, self.send_button):
            button.setMinimumWidth(56)
        col = QVBoxLayout(self)
        col.setContentsMargins(4, 8, 4, 8)
        for widget in above:
            col.addWidget(widget)
        col.addWidget(self.model_notice)
        col.addWidget(transcript, 1)
        self.context_bar = ContextBar(chat, chat.client, palette)
        col.addWidget(self.context_bar)
        col.addWidget(self.context_notice)
        col.addWidget(self.save_notice)
        self.edit_bar = EditBar(palette)
        col.addWidget(self.edit_bar)
        col.addWidget(self.attachments)
        col.addWidget(self.composer)
        self.attachments.place_button_in(self.composer)
        col.addWidget(self.blocked_label)
        col.addLayout(buttons)
        # Tab from the message box goes to Send (the row's layout order made it Regenerate), then the other reply
        # buttons; the Attach button at the box's edge comes after them
        chain = (self.composer, self.send_button, self.stop_button, self.continue_button, self.regen_button,
                 self.edit_button, self.attachments.attach_button)
        for first, second in pairwise(chain):
            QWidget.setTabOrder(first, second)

        self.composer.sig_submit.connect(self.send)
        self.composer.sig_images.connect(self.attachments.add)
        self.attachments.sig_message.connect(self.sig_message)
        chat.sig_model_changed.connect(self.set_model)
        self.setAcceptDrops(True)  # an image dropped anywhere on the chat, not only on the input box
        self.send_button.clicked.connect(self.send)
        self.stop_button.clicked.connect(chat.stop)
        self.regen_button.clicked.connect(chat.regenerate)
        self.edit_button.clicked.connect(self.edit_last)
        self.continue_button.clicked.connect(self.continue_reply)
        transcript.sig_edit.connect(self.edit_at)
        self.edit_bar.sig_cancel.connect(self.cancel_edit)
        chat.sig_context_notice.connect(self.show_context_notice)
        chat.sig_save_notice.connect(self.show_save_notice)
        chat.sig_reply_started.connect(lambda: self._set_replying(True))
        chat.sig_reply_finished.connect(lambda _status: self._set_replying(False))
        chat.sig_conversation_opened.connect(self._update_buttons)
        chat.sig_version_shown.connect(self._update_buttons)  # Continue comes and goes with the version shown
        self._update_buttons()

    def send(self) -> None:
        reason = self.blocked_reason()
        if reason:  # Enter in the composer reaches here with Send disabled
            self.sig_message.emit(reason, 4000)
            return
        text, images = self.composer.toPlainText(), tuple(self.attachments.images)
        if images and self.attachments.refusal:  # attached for a model that is no longer loaded
            self.sig_message.emit(self.attachments.refusal, 6000)
            return
        sent = (self.chat.send_edited(self.edit_bar.message_id, text, images) if self.edit_bar.message_id is not None
                else self.chat.send(text, images))
        if sent:
            self.edit_bar.end()
            self.composer.clear()
            self.attachments.take()
            self.sig_sent.emit()

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:
        if image_input.carries_image(event.mimeData()):
            event.acceptProposedAction()

    def dropEvent(self, event: QDropEvent) -> None:
        found, refused = image_input.from_mime(event.mimeData())
        self.attachments.add(found, refused)
        event.acceptProposedAction()

    def edit_last(self) -> None:
        """Put the last message in the composer to edit; nothing changes until it is sent."""
        self._edit(self.chat.user_message_at())

    def edit_at(self, index: int) -> None:
        """Put the message at transcript position ``index`` in the composer to edit (its Edit link)."""
        self._edit(self.chat.user_message_at(index))

    def continue_reply(self) -> None:
        reason = self.blocked_reason()
        if reason:
            self.sig_message.emit(reason, 4000)
            return
        self.chat.continue_reply()

    def _edit(self, message: Message | None) -> None:
        if message is None:
            return
        self.edit_bar.begin(message.id, self.edit_bar.draft if self.edit_bar.editing else self.composer.toPlainText())
        self.composer.setPlainText(message.content)
        self.attachments.set_images(list(self.chat.images_of(message)))
        self.composer.setFocus()

    def cancel_edit(self) -> bool:
        """Give up editing, the draft from before back in the composer; False when nothing was being edited."""
        if not self.edit_bar.editing:
            return False
        self.composer.setPlainText(self.edit_bar.end())
        return True

    def set_model(self, model: ModelInfo | None) -> None:
        """The loaded model (None: none): images can be attached only when it has a vision projector."""
        self.attachments.set_refusal(NO_MODEL if model is None else "" if model.vision else NO_PROJECTOR)

    def show_notice(self, text: str) -> None:
        self.model_notice.setText(text)
        self.model_notice.setVisible(bool(text))

    def show_context_notice(self, text: str) -> None:
        self.context_notice.setText(text)
        self.context_notice.setVisible(bool(text))

    def show_save_notice(self, text: str) -> None:
        self.save_notice.setText(text)
        self.save_notice.setVisible(bool(text))

    def set_blocked(self, reason: str) -> None:
        """No reply can be asked for now, for ``reason`` ("" lifts it): shown beside Send and as its tooltip."""
        self.blocked_label.setText(reason)
        self.blocked_label.setVisible(bool(reason))
        self._update_buttons()

    def _set_replying(self, replying: bool) -> None:
        self._replying = replying
        self._update_buttons()

    def _update_buttons(self) -> None:
        reason = self.blocked_label.text()
        asked = any(m.role == "user" for m in self.chat.transcript.messages)  # something to redo or edit
        empty = "" if asked else "This chat has no message yet: send one first."
        self.stop_button.setEnabled(self._replying)
        self.edit_button.setEnabled(not self._replying and asked)
        self.edit_button.setToolTip(empty)
        self.send_button.setEnabled(not self._replying and not reason)
        self.send_button.setToolTip(reason)
        self.regen_button.setEnabled(not self._replying and not reason and asked)
        last = self.chat.transcript.messages[-1] if self.chat.transcript.messages else None
        self.continue_button.setVisible(last is not None and last.unfinished)
        self.continue_button.setEnabled(not self._replying and not reason)
        self.regen_button.setToolTip(reason or empty)
