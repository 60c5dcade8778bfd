"""One reply at a time, from the engine into the transcript, the statistics
panel and the store.

The reply is written to disk while it streams (at most every
``SAVE_INTERVAL_S``), through the chat's :class:`ReplySaver`. A prompt the
worker refuses as too long for the context (a ``context`` error, then
``done``) is asked again without the oldest turn (``app/chat/context_fit.py``),
until it fits or only the newest message is left; ``cut`` remembers where the
open chat was cut, so the next reply starts there.

A reply that ends before its end (Stop, the length limit, a dead engine) is
"unfinished": the transcript offers Continue on it, which streams on into the
same reply (``continuing``: its text so far is the start of the assistant's turn).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from PySide6.QtCore import QObject, Signal

from app.chat import written_by
from app.chat.context_fit import Turn, left_out_notice, too_long_notice
from app.chat.reply_saver import ReplySaver
from app.chat.stats_panel import StatsPanel
from app.chat.store import Message
from app.chat.transcript import TranscriptView
from app.engine_client import EngineClient
from engine.speculative.stats import StatsSnapshot
from engine.worker.events import DoneEvent, ErrorEvent, PrefillEvent, StatsEvent, TokenEvent

SAVE_INTERVAL_S = 0.5  # a killed app loses at most this much of a streaming reply


class ReplyStream(QObject):
    """Streams the reply being asked for; ``ask(turn)`` sends a turn and returns its request id.

    Signals:
        sig_finished(str): the reply ended; the argument is the stored status.
        sig_notice(str): a message for the status bar.
        sig_context_notice(str): what the reply left out to fit the context ("" for nothing).
    """

    sig_finished = Signal(str)
    sig_notice = Signal(str)
    sig_context_notice = Signal(str)

    def __init__(self, client: EngineClient, transcript: TranscriptView, stats_panel: StatsPanel,
                 saver: ReplySaver, ask: Callable[[Turn], str], parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.client, self.transcript, self.stats_panel, self.saver, self.ask = (
            client, transcript, stats_panel, saver, ask)
        self.request_id: str | None = None
        self.reply: Message | None = None
        self.turn: Turn | None = None  # the reply being asked for
        self.last_stats: StatsSnapshot | None = None
        self.cut: int | None = None  # the open chat's oldest message that still fit its last reply
        self.dropped = 0  # messages the open chat's last reply left out to fit the context
        self.context_size = 0  # tokens; the loaded model's n_ctx (0 before a model is loaded)
        self._text = ""
        self._continued = ""  # the text a continued reply had before (Continue appends to it)
        self._so_far: tuple[int, int] | None = None  # a continued reply's tokens and parts before (None: unknown)
        self._last_save = 0.0
        self._stopping = False
        self.author: dict[str, str] = {}  # the model and sampling this reply is asked with (app/chat/written_by.py)
        client.sig_token.connect(self._on_token)
        client.sig_stats.connect(self._on_stats)
        client.sig_prefill.connect(self._on_prefill)
        client.sig_done.connect(self._on_done)
        client.sig_error.connect(self._on_error)
        client.sig_died.connect(self._on_died)

    def start(self, reply: Message, turn: Turn) -> None:
        """Ask for ``reply`` (its row stored, ``streaming``: empty, or the text a continued turn goes on from)."""
        if self.cut is not None:
            turn.start_at(self.cut)
        self.turn, self.reply, self._stopping = turn, reply, False
        self.stats_panel.reset()
        self._text = self._continued = reply.content if turn.continuing else ""
        self._so_far = written_by.so_far(reply.stats) if turn.continuing else None
        self._last_save = time.monotonic()
        self.request_id = self.ask(turn)
        if turn.continuing:
            self.transcript.resume_reply()
        else:
            self.transcript.begin_reply(reply.id, reply.version, reply.version_count)

    def stop(self) -> None:
        if self.request_id is not None:
            self._stopping = True  # also ends a retry the worker has not started yet
            self.client.cancel(self.request_id)

    def end_now(self) -> None:
        """Stop and end the reply at once, as stopped, with every token received so far written (the app
        quits: the worker's answer to the cancel would come too late, and the last save could be a second
        old)."""
        if self.request_id is not None:
            self.stop()
            self._finish("cancelled", self.last_stats, unfinished=True)

    def _retry_shorter(self) -> bool:
        """After a prompt that did not fit: ask again without the oldest turn. False when nothing is left to drop."""
        assert self.turn is not None
        if not self.turn.drop_oldest_turn():
            return False
        self.cut = self.turn.first_kept_id
        self.turn.refused = ""
        self.request_id = self.ask(self.turn)
        return True

    # -- engine events ----------------------------------------------------------
    def _on_token(self, ev: TokenEvent) -> None:
        if ev.id != self.request_id or self.reply is None:
            return
        self._text += ev.text
        self.transcript.append_reply(ev.text, ev.draft)
        now = time.monotonic()
        if now - self._last_save >= SAVE_INTERVAL_S:
            self.saver.save(self.reply.id, content=self._text)
            self._last_save = now

    def _on_prefill(self, ev: PrefillEvent) -> None:
        if ev.id == self.request_id:
            self.stats_panel.show_prefill(ev.done, ev.total)
            self.transcript.show_prefill(ev.done, ev.total)

    def _on_stats(self, ev: StatsEvent) -> None:
        if ev.id == self.request_id:
            self.last_stats = ev.stats
            self.stats_panel.update_stats(ev.stats)

    def _on_done(self, ev: DoneEvent) -> None:
        if ev.id != self.request_id:
            return
        refused = self.turn is not None and bool(self.turn.refused)
        if refused and not self._stopping and self._retry_shorter():
            return
        self.dropped = self.turn.dropped if self.turn else 0
        self.sig_context_notice.emit(too_long_notice(self.turn, self.context_size) if refused and not self._stopping
                                     else left_out_notice(self.turn, self.context_size))
        status = {"cancelled": "cancelled", "error": "error"}.get(ev.finish_reason, "complete")
        if refused and self._stopping:
            status = "cancelled"
        if ev.stats is not None:
            self.last_stats = ev.stats
            self.stats_panel.update_stats(ev.stats, final=True)
        self._finish(status, ev.stats, unfinished=ev.finish_reason in ("length", "cancelled") and not refused)

    def _on_error(self, ev: ErrorEvent) -> None:
        if ev.kind == "speculative_unavailable":
            self.sig_notice.emit(ev.message)
        elif ev.id and ev.id == self.request_id:
            if ev.kind == "context" and self._text == self._continued and self.turn is not None:
                self.turn.refused = ev.message  # the prompt did not fit: "done" follows, then a shorter try
            else:
                self.sig_notice.emit(f"The engine reported an error: {ev.message}")

    def _on_died(self, _reason: str) -> None:
        if self.request_id is not None:
            self._finish("interrupted", self.last_stats, unfinished=True)

    def _finish(self, status: str, stats: StatsSnapshot | None, unfinished: bool = False) -> None:
        """The reply ended (``unfinished``: before its end, so it can be continued)."""
        shown = self.transcript.messages[-1] if self.transcript.messages else None
        shown = shown if shown is not None and shown.role == "assistant" else None
        # which characters came from accepted drafts, kept when the transcript's pieces are the whole text
        spans = (written_by.spans_of(shown.segments) if shown is not None
                 and "".join(t for t, _d in shown.segments) == self._text else None)
        whole = (self._so_far[0] + stats.generated_tokens, self._so_far[1] + 1) if self._so_far and stats else None
        if self.reply is not None:
            self.saver.save(self.reply.id, content=self._text, status=status,
                            stats=written_by.with_author(stats.to_dict(), self.author, spans, whole)
                            if stats is not None else None)
        if shown is not None:
            shown.written_by = written_by.author_text(self.author, stats)
            shown.continued = whole
        self.transcript.end_reply(status, stats, unfinished=unfinished and bool(self._text))
        self.request_id = None
        self.reply = None
        self.turn = None
        self.sig_finished.emit(status)
