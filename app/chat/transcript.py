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
message has Copy, Delete and Fork links (``sig_message_action``). A message's
images are thumbnails that open full size (app/chat/image_viewer.py). Web links in
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

from app.chat import image_viewer, markdown
from app.chat.markdown import settle_point
from app.chat.message_html import footer_links, header_html, parse_link, system_prompt_html, unbroken
from app.chat.shown_message import ShownMessage
from app.theme import Palette
from engine.speculative import stats_text
from engine.speculative.stats import StatsSnapshot

FLUSH_MS = 33
MAX_LINE_CHARS = 90  # a readable measure: on a wide window the text column is centred, this wide at most


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
            parts.append(system_prompt_html(self.system_prompt, self.palette_))
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
        m = self.messages[-1]
        head = header_html(m.role, m.status, self._prefill if not m.content else "", self.palette_)
        cursor = self._replace_from(self._stream_start, head)
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
    def _message_html(self, index: int, m: ShownMessage) -> str:
        p = self.palette_
        head = header_html(m.role, m.status, self._prefill if not m.content else "", self.palette_)
        if self.highlight_drafts and m.role == "assistant" and m.segments:
            body = "".join(
                f'<span style="background:{p.draft_bg}">{html.escape(t)}</span>' if d else html.escape(t)
                for t, d in m.segments
            )
            body = f'<p style="white-space:pre-wrap">{body}</p>'
        else:
            body = markdown.render(m.content, p.code_palette(), copy_prefix=f"copy:{index}:")
        foot = (stats_text.footer(m.stats, m.status, m.continued)
                if m.role == "assistant" and m.status != "streaming" else "")
        links = footer_links(index, m.role, m.id, m.status, m.version, m.version_count,
                             m.unfinished and index == len(self.messages) - 1)
        said = [unbroken(text) for text in (m.written_by if m.status != "streaming" else "", foot) if text]
        foot = " &nbsp;·&nbsp; ".join(links + said)
        footer = f'<p style="color:{p.muted};font-size:small;margin-top:0">{foot}</p>' if foot else ""
        return head + image_viewer.thumbnails_html(index, m.images, self._thumbnails) + body + footer

    def loadResource(self, kind: int, name: QUrl) -> object:
        """Thumbnails come from memory, drawn once; anything else as before."""
        if name.scheme() == "thumb":
            return self._thumbnails.get(name.toString())
        return super().loadResource(kind, name)

    def _scroll_to_end(self) -> None:
        bar = self.verticalScrollBar()
        bar.setValue(bar.maximum())

    def _on_anchor(self, url: QUrl) -> None:
        if url.scheme() in ("http", "https", "mailto"):
            QDesktopServices.openUrl(url)
            return
        kind, args = parse_link(url.toString())
        if kind == "version":
            self.sig_version.emit(*args)
        elif kind == "edit":
            self.sig_edit.emit(*args)
        elif kind == "continue":
            self.sig_continue.emit()
        elif kind == "system-prompt":
            self.sig_system_prompt.emit()
        elif kind == "message":
            self.sig_message_action.emit(*args)
        elif kind == "image":  # a thumbnail: the image full size
            image_viewer.show_image(self, self.messages[args[0]].images, args[1])
        elif kind == "copy":
            msg_index, block_index = args
            code = markdown.code_blocks(self.messages[msg_index].content)[block_index]
            QGuiApplication.clipboard().setText(code)
            self.sig_copied.emit(code)
