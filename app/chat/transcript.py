"""The transcript: rendered messages, with the streaming reply updated in place.

Tokens arrive far faster than a screen needs; they are buffered and the
streaming message is updated at most every ``FLUSH_MS``. A flush does work in
proportion to what arrived, not to the reply: new text is appended as plain
text; when a paragraph is complete (a blank line outside any code fence) that
plain text is replaced by its Markdown rendering, once. When the reply ends
it is rendered once more, whole, with its footer.

A regenerated reply keeps its earlier versions, and an edited message its
earlier branches: the footer shows ``‹ 2/3 ›``, and the arrows are links the
chat controller answers (``sig_version``). A user message's footer has an
Edit link (``sig_edit``), and a reply that ended before its end (Stop, the
length limit, a dead engine) a Continue link (``sig_continue``); every stored
message has Copy, Delete and Fork links (``sig_message_action``). Web links in
replies open in the browser; nothing else is followed.

The chat's system prompt, when it has one, is shown above the messages (the
model reads it first; a switcher expects to see it), with an Edit link
(``sig_system_prompt``) to the chat's settings.

On a wide window the text keeps a readable width (``MAX_LINE_CHARS``
average characters), centred, instead of running across the whole screen.

The view owns its list of messages: others read ``messages`` and change it
through :meth:`~TranscriptView.set_messages`, :meth:`~TranscriptView.append`,
:meth:`~TranscriptView.replace`, :meth:`~TranscriptView.pop` and the
streaming calls, so what is shown always matches the list.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field

from PySide6.QtCore import QTimer, QUrl, Signal
from PySide6.QtGui import (
    QDesktopServices,
    QGuiApplication,
    QImage,
    QPalette,
    QResizeEvent,
    QTextBlockFormat,
    QTextCharFormat,
    QTextCursor,
)
from PySide6.QtWidgets import QTextBrowser, QWidget

from app.chat import image_input, markdown
from app.chat.attachments import Attachment
from app.theme import Palette
from engine.speculative import stats_text
from engine.speculative.stats import StatsSnapshot

FLUSH_MS = 33
MESSAGE_ACTIONS = ("copy", "delete", "fork")  # each message's links (app/chat/message_actions.py answers)
SYSTEM_PROMPT_CHARS = 300  # of the system prompt shown above the messages
MAX_LINE_CHARS = 90  # a readable measure: on a wide window the text column is centred, this wide at most


@dataclass
class ShownMessage:
    role: str
    content: str
    status: str = "complete"
    stats: StatsSnapshot | None = None
    segments: list[tuple[str, bool]] = field(default_factory=list)  # (text, from accepted drafts)
    id: int | None = None  # the stored message
    version: int = 0  # which of the message's versions this is (0-based): regenerations, or an edit's branches
    version_count: int = 1
    unfinished: bool = False  # ended before its end (stopped, interrupted, the length limit): Continue goes on
    images: tuple[Attachment, ...] = ()  # attached images, shown as thumbnails above the text
    written_by: str = ""  # a reply's model, sampling and speculative settings, in words (app/chat/written_by.py)


class TranscriptView(QTextBrowser):
    """Shows a conversation.

    Signals:
        sig_copied(str): a code block was copied to the clipboard.
        sig_version(int, int): the message at this position wants its previous (-1) or next (+1) version.
        sig_edit(int): the user message at this position is to be edited.
        sig_continue(): the last reply is to go on from where it ended.
        sig_message_action(str, int): "copy", "delete" or "fork" for the message at this position.
        sig_system_prompt(): the system prompt's Edit link was clicked.
    """

    sig_copied = Signal(str)
    sig_version = Signal(int, int)
    sig_edit = Signal(int)
    sig_continue = Signal()
    sig_message_action = Signal(str, int)
    sig_system_prompt = Signal()

    def __init__(self, palette: Palette, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setOpenLinks(False)
        self.anchorClicked.connect(self._on_anchor)
        # the margins beside the text column (resizeEvent) are the view's, not the viewport's: painted in the
        # transcript's background, not the window's grey
        self.setBackgroundRole(QPalette.ColorRole.Base)
        self.setAutoFillBackground(True)
        self.palette_ = palette
        self.messages: list[ShownMessage] = []
        self.highlight_drafts = False
        self.notice = ""
        self.system_prompt = ""  # the open chat's (the controller sets it before set_messages)
        self._stream_start = -1
        self._tail_start = -1  # where the unfinished part of the streaming reply begins
        self._settled = 0  # characters of the reply rendered as finished paragraphs
        self._settled_blocks = 0  # code blocks among them (numbers the Copy links)
        self._tail_shown = 0  # characters after the settled part shown as plain text
        self._pending = False
        self._prefill = ""  # "Processing prompt (N tokens)… 40%" in the reply's header until its first token
        self._timer = QTimer(self)
        self._timer.setInterval(FLUSH_MS)
        self._timer.timeout.connect(self._flush)
        self.flushes = 0
        self._thumbnails: dict[str, QImage] = {}  # "thumb:<hash>" -> QImage, drawn once per image
        self._to_warm = list(markdown.COMMON_LANGUAGES)
        QTimer.singleShot(200, self, self._warm_up)  # the view as context: no call after it is gone

    def max_line_px(self) -> int:
        return MAX_LINE_CHARS * self.fontMetrics().averageCharWidth()

    def resizeEvent(self, event: QResizeEvent) -> None:
        # the event is the viewport's, whose size the margins change: measure the whole view instead
        side = max(0, (self.width() - self.max_line_px()) // 2)
        if self.viewportMargins().left() != side:
            self.setViewportMargins(side, 0, side, 0)
        super().resizeEvent(event)

    def _warm_up(self) -> None:
        """One language per idle moment (markdown.warm_up), never a long stall."""
        if self._to_warm and self._stream_start < 0:
            markdown.warm_up(self._to_warm.pop(0), self.palette_.code_palette())
        if self._to_warm:
            QTimer.singleShot(50, self, self._warm_up)

    # -- whole transcript ---------------------------------------------------
    def set_messages(self, messages: list[ShownMessage]) -> None:
        self._timer.stop()
        self.messages = messages
        self._stream_start = -1
        self.rerender()

    def append(self, message: ShownMessage) -> None:
        """Show ``message`` after the others (not while a reply streams)."""
        assert self._stream_start < 0, "a reply is streaming"
        self.messages.append(message)
        cursor = QTextCursor(self.document())
        cursor.movePosition(QTextCursor.MoveOperation.End)
        cursor.insertHtml(self._message_html(len(self.messages) - 1, message))
        self._scroll_to_end()

    def replace(self, index: int, message: ShownMessage) -> None:
        """Show ``message`` in place of the one at ``index``."""
        self.messages[index] = message
        self.rerender()

    def pop(self) -> ShownMessage:
        """Take the last message away (not while a reply streams); returns it."""
        assert self._stream_start < 0, "a reply is streaming"
        message = self.messages.pop()
        self.rerender()
        return message

    def rerender(self) -> None:
        """Render every message; a streaming reply is re-attached at the end."""
        p = self.palette_
        self.document().setDefaultStyleSheet(
            f"body {{ color:{p.text}; }} code {{ background:{p.code_bg}; font-family:monospace; }}"
            f" a {{ color:{p.accent}; text-decoration:none; }}"
        )
        streaming = self._stream_start >= 0
        shown = self.messages[:-1] if streaming else self.messages
        parts = []
        if self.notice:
            parts.append(f'<p style="color:{p.muted}"><i>{html.escape(self.notice)}</i></p>')
        if self.system_prompt.strip():
            parts.append(self._system_prompt_html())
        parts += [self._message_html(i, m) for i, m in enumerate(shown)]
        self.setHtml("".join(parts))
        if streaming:
            self._attach_stream()
        self._scroll_to_end()

    def _attach_stream(self) -> None:
        cursor = QTextCursor(self.document())
        cursor.movePosition(QTextCursor.MoveOperation.End)
        cursor.insertBlock()
        self._stream_start = cursor.position()
        self._restart_stream()

    def _restart_stream(self) -> None:
        """Draw the streaming reply again from its header (the text follows at the next flush)."""
        cursor = self._replace_from(self._stream_start, self._header_html(self.messages[-1]))
        self._tail_start = cursor.position()
        self._settled = self._settled_blocks = self._tail_shown = 0
        self._pending = True
        self._flush()

    def show_prefill(self, done: int, total: int) -> None:
        """While the engine reads a long prompt: its progress where the reply will appear."""
        if self._stream_start < 0 or self.messages[-1].content:
            return
        self._prefill = stats_text.prefill_progress(done, total)
        self._restart_stream()

    # -- streaming ------------------------------------------------------------
    def begin_reply(self, message_id: int | None = None, version: int = 0, version_count: int = 1) -> None:
        self.messages.append(ShownMessage(role="assistant", content="", status="streaming", id=message_id,
                                          version=version, version_count=version_count))
        self._stream_start = 0
        self.rerender()
        self._timer.start()

    def resume_reply(self) -> None:
        """Stream on into the last reply (Continue): its text stays, what comes is appended."""
        msg = self.messages[-1]
        msg.status, msg.unfinished = "streaming", False
        self._stream_start = 0
        self.rerender()
        self._timer.start()

    def append_reply(self, text: str, from_draft: bool) -> None:
        if self._prefill:  # the first token: the header goes back to "…"
            self._prefill = ""
            self._restart_stream()
        msg = self.messages[-1]
        msg.content += text
        if msg.segments and msg.segments[-1][1] == from_draft:
            msg.segments[-1] = (msg.segments[-1][0] + text, from_draft)
        else:
            msg.segments.append((text, from_draft))
        self._pending = True

    def end_reply(self, status: str, stats: StatsSnapshot | None, unfinished: bool = False) -> None:
        """The streaming reply ended (``unfinished``: before its end, so Continue is offered)."""
        self._timer.stop()
        self._prefill = ""
        if self.messages and self.messages[-1].role == "assistant":
            self.messages[-1].status = status
            self.messages[-1].stats = stats
            self.messages[-1].unfinished = unfinished
        self._pending = False
        at_end = self.verticalScrollBar().value() >= self.verticalScrollBar().maximum() - 4
        self._replace_from(self._stream_start, self._message_html(len(self.messages) - 1, self.messages[-1]))
        self._stream_start = self._tail_start = -1
        if at_end:
            self._scroll_to_end()

    def _flush(self) -> None:
        if not self._pending or self._stream_start < 0:
            return
        self._pending = False
        self.flushes += 1
        at_end = self.verticalScrollBar().value() >= self.verticalScrollBar().maximum() - 4
        index, msg = len(self.messages) - 1, self.messages[-1]
        if self.highlight_drafts:  # spans follow tokens, not paragraphs: redraw the reply
            self._replace_from(self._stream_start, self._message_html(index, msg))
        else:
            self._flush_incremental(index, msg)
        if at_end:
            self._scroll_to_end()

    def _flush_incremental(self, index: int, msg: ShownMessage) -> None:
        boundary = settle_point(msg.content, self._settled)
        if boundary > self._settled:  # paragraphs completed: plain text out, Markdown in
            chunk = msg.content[self._settled:boundary]
            cursor = self._replace_from(self._tail_start, "")
            cursor.insertBlock()
            cursor.insertHtml(markdown.render(chunk, self.palette_.code_palette(), f"copy:{index}:",
                                              first_block=self._settled_blocks))
            self._settled_blocks += len(markdown.code_blocks(chunk))
            self._settled, self._tail_start, self._tail_shown = boundary, cursor.position(), 0
        new = msg.content[self._settled + self._tail_shown:]
        if not new:
            return
        cursor = QTextCursor(self.document())
        cursor.movePosition(QTextCursor.MoveOperation.End)
        if self._tail_shown == 0:
            cursor.insertBlock(QTextBlockFormat(), QTextCharFormat())
            new = new.lstrip("\n")
        cursor.insertText(new)
        self._tail_shown = len(msg.content) - self._settled

    def _replace_from(self, position: int, html_text: str) -> QTextCursor:
        """Replace everything from ``position`` to the end of the document."""
        cursor = QTextCursor(self.document())
        cursor.setPosition(position)
        cursor.movePosition(QTextCursor.MoveOperation.End, QTextCursor.MoveMode.KeepAnchor)
        cursor.removeSelectedText()
        if html_text:
            cursor.insertHtml(html_text)
        return cursor

    # -- rendering ------------------------------------------------------------
    def _header_html(self, m: ShownMessage) -> str:
        p = self.palette_
        who = {"user": "You", "assistant": "Assistant", "system": "System"}.get(m.role, m.role)
        color = p.accent if m.role == "assistant" else p.user
        working = html.escape(self._prefill) if self._prefill and not m.content else "…"
        return (f'<p style="margin-top:14px;margin-bottom:2px"><b style="color:{color}">{who}</b>'
                + (f' <span style="color:{p.muted}">{working}</span>' if m.status == "streaming" else "") + "</p>")

    def _message_html(self, index: int, m: ShownMessage) -> str:
        p = self.palette_
        head = self._header_html(m)
        if self.highlight_drafts and m.role == "assistant" and m.segments:
            body = "".join(
                f'<span style="background:{p.draft_bg}">{html.escape(t)}</span>' if d else html.escape(t)
                for t, d in m.segments
            )
            body = f'<p style="white-space:pre-wrap">{body}</p>'
        else:
            body = markdown.render(m.content, p.code_palette(), copy_prefix=f"copy:{index}:")
        foot = stats_text.footer(m.stats, m.status) if m.role == "assistant" and m.status != "streaming" else ""
        links = []
        if m.version_count > 1 and m.status != "streaming":
            # the arrows at the text's size, bold, with room either side: in the footer's small print they were
            # a few pixels wide and hard to hit
            arrow = 'style="font-size:medium;font-weight:bold;text-decoration:none"'
            links.append(f'<a href="version:{index}:-1" {arrow}>&nbsp;&nbsp;‹&nbsp;&nbsp;</a>'
                         f'{m.version + 1}/{m.version_count}'
                         f'<a href="version:{index}:1" {arrow}>&nbsp;&nbsp;›&nbsp;&nbsp;</a>')
        if m.role == "user" and m.id is not None:
            links.append(f'<a href="edit:{index}">Edit</a>')
        if m.unfinished and index == len(self.messages) - 1 and m.status != "streaming":
            links.append('<a href="continue:">Continue</a>')
        if m.id is not None and m.status != "streaming":
            links += [f'<a href="message-{action}:{index}">{action.capitalize()}</a>' for action in MESSAGE_ACTIONS]
        said = [html.escape(text) for text in (m.written_by if m.status != "streaming" else "", foot) if text]
        foot = " &nbsp;·&nbsp; ".join(links + said)
        footer = f'<p style="color:{p.muted};font-size:small;margin-top:0">{foot}</p>' if foot else ""
        return head + self._images_html(m) + body + footer

    def _system_prompt_html(self) -> str:
        """The system prompt, muted, cut at SYSTEM_PROMPT_CHARS (the whole in the chat's settings)."""
        p = self.palette_
        text = " ".join(self.system_prompt.split())
        if len(text) > SYSTEM_PROMPT_CHARS:
            text = text[:SYSTEM_PROMPT_CHARS] + "…"
        return (f'<p style="color:{p.muted};margin-bottom:12px"><b>System prompt</b>: {html.escape(text)}'
                f' &nbsp;·&nbsp; <a href="system-prompt:">Edit</a></p>')

    def _images_html(self, m: ShownMessage) -> str:
        """A message's images as thumbnails (drawn by :meth:`loadResource`)."""
        if not m.images:
            return ""
        cells = []
        for image in m.images:
            name = f"thumb:{image.hash}"
            if name not in self._thumbnails:
                self._thumbnails[name] = image_input.thumbnail(image)
            thumb = self._thumbnails[name]
            cells.append(f'<img src="{name}" width="{thumb.width()}" height="{thumb.height()}"> ')
        return f'<p style="margin-top:2px;margin-bottom:2px">{"".join(cells)}</p>'

    def loadResource(self, kind: int, name: QUrl) -> object:
        """Thumbnails come from memory, drawn once; anything else as before."""
        if name.scheme() == "thumb":
            return self._thumbnails.get(name.toString())
        return super().loadResource(kind, name)

    def _scroll_to_end(self) -> None:
        bar = self.verticalScrollBar()
        bar.setValue(bar.maximum())

    def _on_anchor(self, url: QUrl) -> None:
        text = url.toString()
        if url.scheme() in ("http", "https", "mailto"):
            QDesktopServices.openUrl(url)
        elif text.startswith("version:"):
            _, msg_index, step = text.split(":")
            self.sig_version.emit(int(msg_index), int(step))
        elif text.startswith("edit:"):
            self.sig_edit.emit(int(text.split(":")[1]))
        elif text.startswith("continue:"):
            self.sig_continue.emit()
        elif text == "system-prompt:":
            self.sig_system_prompt.emit()
        elif text.startswith("message-"):  # message-delete:3 (a code block's Copy is copy:3:0)
            action, msg_index = text.removeprefix("message-").split(":")
            self.sig_message_action.emit(action, int(msg_index))
        elif text.startswith("copy:"):
            _, msg_index, block_index = text.split(":")
            blocks = markdown.code_blocks(self.messages[int(msg_index)].content)
            code = blocks[int(block_index)]
            QGuiApplication.clipboard().setText(code)
            self.sig_copied.emit(code)


def settle_point(text: str, after: int) -> int:
    """The end of the last complete paragraph of ``text`` past ``after``: a blank
    line that is not inside a code fence. Returns ``after`` when there is none."""
    end = len(text)
    while True:
        i = text.rfind("\n\n", after, end)
        if i <= after:
            return after
        if len(markdown.FENCE.findall(text, 0, i)) % 2 == 0:
            return i + 2
        end = i
