"""One chat turn from the input box to the store: builds the request from the
conversation, streams the reply into the transcript and the statistics
panel, and writes the reply to disk while it streams."""

from __future__ import annotations

import time

from PySide6.QtCore import QObject, Signal

from app.chat.chat_settings import ReplyValues, effective
from app.chat.stats_panel import StatsPanel
from app.chat.store import ConversationStore, Message
from app.chat.transcript import ShownMessage, TranscriptView
from app.engine_client import EngineClient
from app.settings import Settings
from engine.speculative.settings import MTP, SPECULATION_OFF, SpeculativeSettings
from engine.speculative.stats import StatsSnapshot
from engine.worker.events import DoneEvent, ErrorEvent, StatsEvent, TokenEvent, stats_from_json

SAVE_INTERVAL_S = 0.5  # a killed app loses at most this much of a streaming reply


class ChatController(QObject):
    """Signals:
        sig_reply_started(): a reply began streaming.
        sig_reply_finished(str): it ended; the argument is the stored status.
        sig_notice(str): a message for the status bar.
    """

    sig_reply_started = Signal()
    sig_reply_finished = Signal(str)
    sig_notice = Signal(str)

    def __init__(self, store: ConversationStore, client: EngineClient, transcript: TranscriptView,
                 stats_panel: StatsPanel, settings: Settings) -> None:
        super().__init__()
        self.store = store
        self.client = client
        self.transcript = transcript
        self.stats_panel = stats_panel
        self.settings = settings
        self.conversation_id: int | None = None
        self.request_id: str | None = None
        self.reply: Message | None = None
        self._reply_text = ""
        self._last_save = 0.0
        self.last_stats: StatsSnapshot | None = None
        self.profile_speculative: SpeculativeSettings | None = None  # from autotune, when there is one
        self.model_has_mtp = True  # "auto" asks for MTP only when the loaded model can draft
        client.sig_token.connect(self._on_token)
        client.sig_stats.connect(self._on_stats)
        client.sig_done.connect(self._on_done)
        client.sig_error.connect(self._on_error)
        client.sig_died.connect(self._on_died)

    # -- conversations ------------------------------------------------------
    def open(self, conversation_id: int) -> None:
        self.conversation_id = conversation_id
        shown = [ShownMessage(m.role, m.content, m.status, stats_from_json(m.stats))
                 for m in self.store.messages(conversation_id)]
        self.transcript.set_messages(shown)
        last = next((m.stats for m in reversed(shown) if m.stats), None)
        self.stats_panel.reset()
        if last:
            self.stats_panel.update_stats(last, final=True)

    def close_conversation(self) -> None:
        """Show no conversation (the open one was deleted)."""
        self.conversation_id = None
        self.transcript.set_messages([])
        self.stats_panel.reset()

    def new_conversation(self) -> int:
        conv = self.store.create(system_prompt=self.settings.system_prompt)
        self.open(conv.id)
        return conv.id

    @property
    def busy(self) -> bool:
        return self.request_id is not None

    # -- a turn -----------------------------------------------------------------
    def send(self, text: str) -> bool:
        """Store the user's message and ask the engine for a reply."""
        text = text.strip()
        if not text or self.busy:
            return False
        if self.conversation_id is None:
            self.new_conversation()
        assert self.conversation_id is not None
        if not self.store.messages(self.conversation_id):
            self.store.update(self.conversation_id, title=_title_from(text))
        self.store.add_message(self.conversation_id, "user", text)
        self.transcript.messages.append(ShownMessage("user", text))
        self._request_reply()
        return True

    def regenerate(self) -> None:
        """Drop the last reply and ask again."""
        if self.busy or self.conversation_id is None:
            return
        msgs = self.store.messages(self.conversation_id)
        if msgs and msgs[-1].role == "assistant":
            self.store.delete_from(self.conversation_id, msgs[-1].id)
            self.transcript.messages.pop()
        if self.store.messages(self.conversation_id):
            self._request_reply()

    def edit_last_user_message(self) -> str:
        """Remove the last user message (and its reply) and return its text for editing."""
        if self.busy or self.conversation_id is None:
            return ""
        msgs = self.store.messages(self.conversation_id)
        last_user = next((m for m in reversed(msgs) if m.role == "user"), None)
        if last_user is None:
            return ""
        self.store.delete_from(self.conversation_id, last_user.id)
        self.open(self.conversation_id)
        return last_user.content

    def stop(self) -> None:
        if self.request_id is not None:
            self.client.cancel(self.request_id)

    def chat_values(self) -> ReplyValues:
        """This conversation's settings over the app's preferences."""
        chat = self.store.get(self.conversation_id).settings if self.conversation_id is not None else {}
        return effective(self.settings, chat)

    def speculative_settings(self, values: ReplyValues | None = None) -> SpeculativeSettings:
        """What this reply asks of the engine: the choice (auto | mtp | off) made into settings.

        "auto" is the autotune profile when there is one, else MTP when the
        loaded model can draft, else off.
        """
        v = values or self.chat_values()
        if v.speculative == "off" or (v.speculative == "auto" and not self.model_has_mtp):
            return SPECULATION_OFF
        if v.speculative == "auto" and self.profile_speculative is not None:
            return self.profile_speculative
        try:
            return SpeculativeSettings(MTP, v.n_max, 0, v.p_min)
        except ValueError as exc:  # a hand-edited settings file: say so, and reply anyway
            self.sig_notice.emit(f"The speculative settings are not valid ({exc}); this reply decodes plainly.")
            return SPECULATION_OFF

    def _request_reply(self) -> None:
        assert self.conversation_id is not None
        conv = self.store.get(self.conversation_id)
        messages = [{"role": "system", "content": conv.system_prompt}] if conv.system_prompt else []
        messages += [{"role": m.role, "content": m.content} for m in self.store.messages(self.conversation_id)
                     if m.content]
        s, v = self.settings, self.chat_values()
        self.request_id = self.client.generate(
            messages=messages, max_tokens=v.max_tokens, temperature=v.temperature, top_k=s.top_k,
            top_p=s.top_p, min_p=s.min_p, speculative=self.speculative_settings(v),
        )
        self.reply = self.store.add_message(self.conversation_id, "assistant", "", status="streaming")
        self._reply_text = ""
        self._last_save = time.monotonic()
        self.stats_panel.reset()
        self.transcript.begin_reply()
        self.sig_reply_started.emit()

    # -- engine events ----------------------------------------------------------
    def _on_token(self, ev: TokenEvent) -> None:
        if ev.id != self.request_id or self.reply is None:
            return
        self._reply_text += ev.text
        self.transcript.append_reply(ev.text, ev.draft)
        now = time.monotonic()
        if now - self._last_save >= SAVE_INTERVAL_S:
            self.store.update_message(self.reply.id, content=self._reply_text)
            self._last_save = now

    def _on_stats(self, ev: StatsEvent) -> None:
        if ev.id == self.request_id:
            self.last_stats = ev.stats
            self.stats_panel.update_stats(ev.stats)

    def _on_done(self, ev: DoneEvent) -> None:
        if ev.id != self.request_id:
            return
        status = {"cancelled": "cancelled", "error": "error"}.get(ev.finish_reason, "complete")
        if ev.stats is not None:
            self.last_stats = ev.stats
            self.stats_panel.update_stats(ev.stats, final=True)
        self._finish(status, ev.stats)

    def _on_error(self, ev: ErrorEvent) -> None:
        if ev.kind == "speculative_unavailable":
            self.sig_notice.emit(ev.message)
        elif ev.id and ev.id == self.request_id:
            self.sig_notice.emit(f"The engine reported an error: {ev.message}")

    def _on_died(self, _reason: str) -> None:
        if self.request_id is not None:
            self._finish("interrupted", self.last_stats)

    def _finish(self, status: str, stats: StatsSnapshot | None) -> None:
        if self.reply is not None:
            self.store.update_message(self.reply.id, content=self._reply_text, status=status,
                                      stats=stats.to_dict() if stats is not None else None)
        self.transcript.end_reply(status, stats)
        self.request_id = None
        self.reply = None
        self.sig_reply_finished.emit(status)


def _title_from(text: str) -> str:
    line = text.strip().splitlines()[0]
    return line[:48] + ("…" if len(line) > 48 else "")
