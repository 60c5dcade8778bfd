"""How much of the model's context the open conversation fills: a thin bar
and "1,234 / 4,096 tokens" under the transcript.

Only the worker can count tokens. While a reply streams, and when it ends,
the count is the reply's own statistics (the prompt as the chat template
rendered it, plus the tokens generated: exact). When a conversation is
opened or a model loaded, the worker tokenizes the conversation's text
(``tokenize`` request; without the template's few tokens per message, so the
label says "about"). When the conversation no longer fits, the chat leaves
out the oldest turns, and the bar says so.
"""

from __future__ import annotations

from PySide6.QtCore import QSize, QTimer
from PySide6.QtWidgets import QHBoxLayout, QLabel, QProgressBar, QWidget

from app.chat.controller import ChatController
from app.engine_client import EngineClient
from app.theme import Palette
from engine.speculative.stats import StatsSnapshot
from engine.worker.events import DoneEvent, StatsEvent, TokensEvent

FULL_AT = 0.9  # from this share of the context on, the bar turns to the warning colour


class OneLineFirst(QLabel):
    """A label that asks for one line and wraps only when the row is short of room: as one unbreakable line,
    "… · nearly full: the oldest messages will be left out" set the chat pane's minimum width, which squeezed
    the chat list to ~90 px at 1000×700; a plain word-wrapped label wrapped even at 1920 px."""

    MIN_WIDTH = 160

    def __init__(self) -> None:
        super().__init__()
        self.setWordWrap(True)

    def sizeHint(self) -> QSize:
        line = self.fontMetrics().horizontalAdvance(self.text()) + 2 * self.margin() + 2
        return QSize(line, self.fontMetrics().height() + 2 * self.margin())

    def minimumSizeHint(self) -> QSize:
        return QSize(min(self.sizeHint().width(), self.MIN_WIDTH), super().minimumSizeHint().height())


class ContextBar(QWidget):
    """The bar and its label; hidden until a model is loaded (the size is unknown before)."""

    def __init__(self, chat: ChatController, client: EngineClient, palette: Palette,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.chat, self.client, self.palette_ = chat, client, palette
        self.used = 0
        self.estimated = False
        self._asked: str | None = None  # the tokenize request whose answer is awaited
        self.bar = QProgressBar()
        self.bar.setTextVisible(False)
        self.bar.setFixedHeight(6)
        self.label = OneLineFirst()
        self.label.setStyleSheet(f"color:{palette.muted}; font-size:small;")
        row = QHBoxLayout(self)
        row.setContentsMargins(4, 0, 4, 0)
        row.addWidget(self.bar, 1)
        row.addWidget(self.label)
        self.hide()
        client.sig_stats.connect(self._on_stats)
        client.sig_done.connect(self._on_done)
        client.sig_tokens.connect(self._on_tokens)
        chat.sig_conversation_opened.connect(self.count)
        client.sig_loaded.connect(lambda _ev: QTimer.singleShot(0, self, self.count))  # after the chat learns the size
        chat.sig_context_notice.connect(lambda _text: self._show())

    def count(self) -> None:
        """Ask the worker for the open conversation's size (not while it loads or has nothing loaded)."""
        self._asked = None
        size = self.chat.context_size
        if not size or self.chat.busy or self.client.state != "ready":
            self._show()
            return
        conv = self.chat.conversation_id
        texts = [] if conv is None else [m.content for m in self.chat.store.messages(conv) if m.content]
        if conv is not None and self.chat.store.get(conv).system_prompt:
            texts.insert(0, self.chat.store.get(conv).system_prompt)
        if not texts:
            self._set(0, estimated=False)
            return
        self._asked = self.client.tokenize("\n".join(texts))

    def _on_tokens(self, ev: TokensEvent) -> None:
        if ev.id is not None and ev.id == self._asked:
            self._asked = None
            self._set(len(ev.tokens), estimated=True)

    def _on_stats(self, ev: StatsEvent) -> None:
        if ev.id == self.chat.request_id:
            self._from_stats(ev.stats)

    def _on_done(self, ev: DoneEvent) -> None:
        if ev.id == self.chat.request_id and ev.stats is not None and ev.stats.prompt_tokens:
            self._from_stats(ev.stats)

    def _from_stats(self, stats: StatsSnapshot) -> None:
        if stats.prompt_tokens:
            self._set(stats.prompt_tokens + stats.generated_tokens, estimated=False)

    def _set(self, used: int, estimated: bool) -> None:
        self.used, self.estimated = used, estimated
        self._show()

    def _show(self) -> None:
        size = self.chat.context_size
        self.setVisible(bool(size))
        if not size:
            return
        p = self.palette_
        share = min(1.0, self.used / size)
        self.bar.setRange(0, size)
        self.bar.setValue(min(self.used, size))
        colour = p.bad if share >= FULL_AT else p.accent
        self.bar.setStyleSheet(f"QProgressBar {{ border:none; background:{p.border}; border-radius:3px; }}"
                               f" QProgressBar::chunk {{ background:{colour}; border-radius:3px; }}")
        about = "about " if self.estimated else ""
        # a reply that ran to the context's end counts its last token, which never took a slot: "513 / 512"
        text = f"{about}{min(self.used, size):,} / {size:,} tokens of context ({100 * share:.0f}%)"
        dropped = self.chat.dropped_messages
        if dropped:
            text += f" · the oldest {dropped} message{'s' if dropped != 1 else ''} left out"
        elif share >= 1.0:
            text += " · full: the next reply leaves out the oldest messages"
        elif share >= FULL_AT:
            text += " · nearly full: the oldest messages will be left out"
        self.label.setText(text)
        self.setToolTip("How much of the model's context this conversation fills. When it is full, the "
                        "oldest messages are left out of the next reply (the system prompt and your newest "
                        "message always stay). Raise the context size in Settings → Preferences.")


