"""One chat turn from the input box to the store: builds the request from the
conversation, streams the reply into the transcript and the statistics
panel, and writes the reply to disk while it streams.

A conversation may outgrow the model's context. The app cannot count tokens
(only the worker has the tokenizer), so it lets the worker decide: a prompt
that does not fit is refused before anything is decoded (a ``context``
error, then ``done``), and the controller asks again without the oldest
turn, until it fits or only the new message is left. Where the open
conversation's last reply was cut is remembered, so the next one starts there
(a few tries at most per reply, not one per message of a long chat).

While the worker reads a long prompt it reports progress (``prefill``
events); the statistics panel shows "Processing prompt (N tokens)…" with a
bar until the first token. The panel states MTP's speedup only where it was
measured: the autotune profile's, when the reply uses the profile's settings.
A model change clears the figures of the previous model.

The reply is saved through a :class:`ReplySaver`: on a full disk it stays in
memory and on screen, the chat says it is not saved, the reply still ends
(the chat is never left busy), and the saver writes it once there is room.
The chat's other writes are refused on a full disk before anything changes
on screen or is asked of the engine, with a status-bar message that says what
was not done: a message (or an edit) stays in the composer, Regenerate and a
version switch keep the reply shown. A message and its empty reply row are
written together (``ConversationStore.add_turn``), and an edit replaces the
old exchange in that same write, so neither is ever half done.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from PySide6.QtCore import QObject, Signal

from app.chat.chat_settings import ReplyValues, effective
from app.chat.reply_saver import ReplySaver, refusal
from app.chat.stats_panel import StatsPanel
from app.chat.store import ConversationStore, Message, NotSaved
from app.chat.transcript import ShownMessage, TranscriptView
from app.engine_client import EngineClient
from app.settings import Settings
from app.text_check import is_text
from engine.speculative.settings import ADAPTIVE, MODES, MTP, SPECULATION_OFF, SpeculativeSettings
from engine.speculative.stats import StatsSnapshot
from engine.worker.events import DoneEvent, ErrorEvent, PrefillEvent, StatsEvent, TokenEvent, stats_from_json

SAVE_INTERVAL_S = 0.5  # a killed app loses at most this much of a streaming reply
CONTEXT_SETTING = "Settings → Preferences → Context size"


@dataclass
class Turn:
    """What one reply is asked for: the system prompt and the conversation,
    of which the oldest ``dropped`` messages are left out because they did
    not fit the context."""

    system: str
    messages: list[Message]  # the newest (the message being answered) last
    dropped: int = 0
    refused: str = ""  # the engine's words when the last attempt did not fit

    def request_messages(self) -> list[dict[str, str]]:
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + [{"role": m.role, "content": m.content} for m in self.messages[self.dropped:]]

    def start_at(self, first_id: int) -> None:
        """Leave out what an earlier reply had to leave out: messages older than ``first_id``."""
        self.dropped = next((i for i, m in enumerate(self.messages) if m.id >= first_id), 0)
        self._to_user_message()

    def drop_oldest_turn(self) -> bool:
        """Leave out the oldest kept turn; False when only the newest message is left.

        The cut lands on a user message: chat templates often refuse a
        conversation that starts with the assistant."""
        if self.dropped >= len(self.messages) - 1:
            return False
        self.dropped += 1
        self._to_user_message()
        return True

    @property
    def first_kept_id(self) -> int:
        return self.messages[self.dropped].id

    def _to_user_message(self) -> None:
        last = len(self.messages) - 1
        while self.dropped < last and self.messages[self.dropped].role != "user":
            self.dropped += 1


class ChatController(QObject):
    """Signals:
        sig_reply_started(): a reply began streaming.
        sig_reply_finished(str): it ended; the argument is the stored status.
        sig_notice(str): a message for the status bar.
        sig_context_notice(str): what the open chat's last reply left out to fit the context ("" for nothing).
        sig_conversation_opened(): another conversation (or none) is shown; what can be edited changed.
        sig_save_notice(str): why a reply is not saved yet ("" once it is).
    """

    sig_reply_started = Signal()
    sig_reply_finished = Signal(str)
    sig_notice = Signal(str)
    sig_context_notice = Signal(str)
    sig_conversation_opened = Signal()
    sig_save_notice = Signal(str)

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
        self._profile: SpeculativeSettings | None = None  # from autotune, when there is one
        self.profile_speedup: float | None = None  # what autotune measured for it against plain decoding
        self.model_has_mtp = True  # "auto" asks for MTP only when the loaded model can draft
        self.context_size = 0  # tokens; the loaded model's n_ctx (0 before a model is loaded)
        self.turn: Turn | None = None  # the reply being asked for
        self._cut: int | None = None  # the open chat's oldest message that still fit its last reply
        self._stopping = False
        self.saver = ReplySaver(store, self)
        self.saver.sig_notice.connect(self.sig_save_notice)
        self.saver.sig_saved.connect(lambda: self.sig_notice.emit("The reply waiting for disk space is saved."))
        client.sig_token.connect(self._on_token)
        client.sig_stats.connect(self._on_stats)
        client.sig_prefill.connect(self._on_prefill)
        client.sig_done.connect(self._on_done)
        client.sig_error.connect(self._on_error)
        client.sig_died.connect(self._on_died)
        transcript.sig_version.connect(self.show_version)

    @property
    def profile_speculative(self) -> SpeculativeSettings | None:
        """The autotune profile's settings for the loaded model ("auto" uses them)."""
        return self._profile

    @profile_speculative.setter
    def profile_speculative(self, setting: SpeculativeSettings | None) -> None:
        # another profile (or none): its measured speedup is set after it, never kept from the last one
        self._profile = setting
        self.profile_speedup = None

    # -- conversations ------------------------------------------------------
    def model_loaded(self, n_ctx: int) -> None:
        """A model was loaded with ``n_ctx`` tokens of context: another size or
        tokenizer may fit what was left out before, so the next reply tries it all.
        The statistics shown were the previous model's: they are cleared."""
        self.context_size = n_ctx
        self._cut = None
        self.last_stats = None
        if not self.busy:
            self.stats_panel.reset()

    def open(self, conversation_id: int) -> None:
        self.conversation_id = conversation_id
        self._cut = None
        self.sig_context_notice.emit("")
        shown = []
        for m in self.store.messages(conversation_id):
            waiting = self.saver.waiting_for(m.id)  # a reply the disk has not taken yet shows as it is in memory
            shown.append(ShownMessage(m.role, waiting.get("content", m.content), waiting.get("status", m.status),
                                      stats_from_json(waiting.get("stats", m.stats)), id=m.id, version=m.version,
                                      version_count=m.version_count))
        self.transcript.set_messages(shown)
        last = next((m.stats for m in reversed(shown) if m.stats), None)
        self.stats_panel.reset()
        if last:
            self.stats_panel.update_stats(last, final=True)
        self.sig_conversation_opened.emit()

    def close_conversation(self) -> None:
        """Show no conversation (the open one was deleted)."""
        self.conversation_id = None
        self._cut = None
        self.sig_context_notice.emit("")
        self.transcript.set_messages([])
        self.stats_panel.reset()
        self.sig_conversation_opened.emit()

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
        return self._send(text)

    def _send(self, text: str, replace_from: int | None = None) -> bool:
        """Store ``text`` (in place of message ``replace_from`` and what followed it) and ask for a reply.

        False, with the reason on the status bar, when nothing was stored or asked: the caller
        keeps the text (it stays in the composer)."""
        text = text.strip()
        if not text or self.busy:
            return False
        if not is_text(text):  # SQLite and the worker's pipe would both refuse it, inside Qt
            self.sig_notice.emit("The message holds a character that is not valid text (a lone surrogate, "
                                 "as a broken paste can leave): remove it and send again.")
            return False
        try:
            self.saver.write_waiting()  # a reply still waiting for the disk goes first
            if self.conversation_id is None:
                self.new_conversation()
            assert self.conversation_id is not None
            earlier = [m for m in self.store.messages(self.conversation_id)
                       if replace_from is None or m.id < replace_from]
            user, reply = self.store.add_turn(self.conversation_id, text, replace_from=replace_from,
                                              title=None if earlier else _title_from(text))
        except NotSaved as exc:  # the message stays in the composer; nothing was sent
            self.sig_notice.emit(refusal(exc, "the message was not sent. Free some space and send it again."))
            return False
        if replace_from is not None:
            self.open(self.conversation_id)  # the edited exchange is gone; the new message shows
            if self.transcript.messages and self.transcript.messages[-1].id == reply.id:
                self.transcript.messages.pop()  # its reply row shows as it streams, below
        else:
            self.transcript.messages.append(ShownMessage("user", text, id=user.id))
        self._start_reply(reply)
        return True

    def regenerate(self) -> None:
        """Ask again for the last reply; the earlier one is kept as a version (‹1/2›)."""
        if self.busy or self.conversation_id is None:
            return
        msgs = self.store.messages(self.conversation_id)
        if not msgs:
            return
        again = msgs[-1].role == "assistant"
        try:
            self.saver.write_waiting()  # the reply shown must be on disk before it becomes an earlier version
            reply = (self.store.new_version(msgs[-1].id) if again
                     else self.store.add_message(self.conversation_id, "assistant", "", status="streaming"))
        except NotSaved as exc:
            self.sig_notice.emit(refusal(exc, "no new reply was asked for, and the one shown is kept. "
                                              "Free some space and press Regenerate again."))
            return
        if again:
            self.transcript.messages.pop()
        self._start_reply(reply)

    def last_user_message(self) -> Message | None:
        """The message "Edit last" edits; nothing changes until the edit is sent."""
        if self.busy or self.conversation_id is None:
            return None
        return next((m for m in reversed(self.store.messages(self.conversation_id)) if m.role == "user"), None)

    def send_edited(self, message_id: int, text: str) -> bool:
        """Replace the edited message (and what followed it) by ``text``, and ask for a reply.

        Refused (False, the exchange kept as it was) when ``text`` cannot be sent or stored."""
        if not text.strip() or self.busy or self.conversation_id is None:
            return False
        last = self.last_user_message()
        if last is None or last.id != message_id:  # another chat was opened meanwhile: a new message
            return self.send(text)
        return self._send(text, replace_from=message_id)

    def show_version(self, index: int, step: int) -> None:
        """Show the previous (``step`` -1) or next (+1) version of the reply at transcript position ``index``."""
        shown = self.transcript.messages[index] if 0 <= index < len(self.transcript.messages) else None
        if self.busy or shown is None or shown.id is None:
            return
        try:
            self.saver.write_waiting()  # the shown version's newest text goes into the versions first
            m = self.store.select_version(shown.id, shown.version + step)
        except NotSaved as exc:  # the version shown is the one stored: nothing changes
            self.sig_notice.emit(refusal(exc, "the other version was not shown (the version shown is saved with "
                                              "the chat). Free some space and try again."))
            return
        shown.content, shown.status, shown.stats = m.content, m.status, stats_from_json(m.stats)
        shown.version, shown.version_count, shown.segments = m.version, m.version_count, []
        self.transcript.rerender()

    def stop(self) -> None:
        if self.request_id is not None:
            self._stopping = True  # also ends a retry the worker has not started yet
            self.client.cancel(self.request_id)

    def chat_values(self) -> ReplyValues:
        """This conversation's settings over the app's preferences."""
        chat = self.store.get(self.conversation_id).settings if self.conversation_id is not None else {}
        return effective(self.settings, chat)

    def speculative_settings(self, values: ReplyValues | None = None) -> SpeculativeSettings:
        """What this reply asks of the engine: the choice (auto | mtp | ngram | mtp+ngram | off) made into settings.

        "auto" is the autotune profile when there is one, else MTP with
        adaptive depth up to the chosen n_max when the loaded model can draft
        (it falls back to plain steps where drafts do not pay), else off.
        """
        v = values or self.chat_values()
        if v.speculative == "off" or (v.speculative == "auto" and not self.model_has_mtp):
            return SPECULATION_OFF
        if v.speculative == "auto" and self.profile_speculative is not None:
            return self.profile_speculative
        if v.speculative == "auto":
            return SpeculativeSettings(MTP, v.n_max, 0, v.p_min, depth=ADAPTIVE)
        try:
            return SpeculativeSettings(v.speculative if v.speculative in MODES else MTP, v.n_max, 0, v.p_min)
        except ValueError as exc:  # a hand-edited settings file: say so, and reply anyway
            self.sig_notice.emit(f"The speculative settings are not valid ({exc}); this reply decodes plainly.")
            return SPECULATION_OFF

    def _start_reply(self, reply: Message) -> None:
        """Ask for ``reply`` (its row is stored, empty and ``streaming``) from the conversation before it."""
        assert self.conversation_id is not None
        conv = self.store.get(self.conversation_id)
        history = [m for m in self.store.messages(self.conversation_id) if m.content and m.id != reply.id]
        self.turn = Turn(conv.system_prompt, history)
        if self._cut is not None:
            self.turn.start_at(self._cut)
        self._stopping = False
        self.stats_panel.reset()
        self.reply = reply
        self._reply_text = ""
        self._last_save = time.monotonic()
        self._ask()
        self.transcript.begin_reply(reply.id, reply.version, reply.version_count)
        self.sig_reply_started.emit()

    def _ask(self) -> None:
        """Send the turn, as far as it is kept, to the engine."""
        assert self.turn is not None
        v = self.chat_values()
        speculative = self.speculative_settings(v)
        measured = speculative == self._profile and speculative.enabled and self.profile_speedup
        self.stats_panel.set_speedup(self.profile_speedup if measured else None, "autotuned")
        self.request_id = self.client.generate(
            messages=self.turn.request_messages(), max_tokens=v.max_tokens, speculative=speculative,
            sampling=v.sampling(),
        )

    def _retry_shorter(self) -> bool:
        """After a prompt that did not fit: ask again without the oldest turn. False when nothing is left to drop."""
        assert self.turn is not None
        if not self.turn.drop_oldest_turn():
            return False
        self._cut = self.turn.first_kept_id
        self.turn.refused = ""
        self._ask()
        return True

    def _context_words(self) -> str:
        return f"the {self.context_size:,}-token context" if self.context_size else "the model's context"

    def _left_out_notice(self) -> str:
        """Tells the user, plainly, what this reply did not see ("" when it saw everything)."""
        dropped = self.turn.dropped if self.turn else 0
        if not dropped:
            return ""
        what = "The oldest message no longer fits" if dropped == 1 else f"The oldest {dropped} messages no longer fit"
        return f"{what} {self._context_words()} and {'was' if dropped == 1 else 'were'} left out of this reply."

    def _too_long_notice(self) -> str:
        engine_said = (self.turn.refused if self.turn else "").split(". ")[0].rstrip(".")
        engine_said = engine_said[:1].lower() + engine_said[1:]
        return (f"This message does not fit {self._context_words()} even without the earlier conversation"
                + (f" ({engine_said})" if engine_said else "")
                + f". Raise the context size ({CONTEXT_SETTING}) or shorten the message"
                + (" or the chat's system prompt." if self.turn and self.turn.system else "."))

    # -- engine events ----------------------------------------------------------
    def _on_token(self, ev: TokenEvent) -> None:
        if ev.id != self.request_id or self.reply is None:
            return
        self._reply_text += ev.text
        self.transcript.append_reply(ev.text, ev.draft)
        now = time.monotonic()
        if now - self._last_save >= SAVE_INTERVAL_S:
            self.saver.save(self.reply.id, content=self._reply_text)
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
        self.sig_context_notice.emit(self._too_long_notice() if refused and not self._stopping
                                     else self._left_out_notice())
        status = {"cancelled": "cancelled", "error": "error"}.get(ev.finish_reason, "complete")
        if refused and self._stopping:
            status = "cancelled"
        if ev.stats is not None:
            self.last_stats = ev.stats
            self.stats_panel.update_stats(ev.stats, final=True)
        self._finish(status, ev.stats)

    def _on_error(self, ev: ErrorEvent) -> None:
        if ev.kind == "speculative_unavailable":
            self.sig_notice.emit(ev.message)
        elif ev.id and ev.id == self.request_id:
            if ev.kind == "context" and not self._reply_text and self.turn is not None:
                self.turn.refused = ev.message  # the prompt did not fit: "done" follows, then a shorter try
            else:
                self.sig_notice.emit(f"The engine reported an error: {ev.message}")

    def _on_died(self, _reason: str) -> None:
        if self.request_id is not None:
            self._finish("interrupted", self.last_stats)

    def _finish(self, status: str, stats: StatsSnapshot | None) -> None:
        if self.reply is not None:
            self.saver.save(self.reply.id, content=self._reply_text, status=status,
                            stats=stats.to_dict() if stats is not None else None)
        self.transcript.end_reply(status, stats)
        self.request_id = None
        self.reply = None
        self.turn = None
        self.sig_reply_finished.emit(status)


def _title_from(text: str) -> str:
    line = text.strip().splitlines()[0]
    return line[:48] + ("…" if len(line) > 48 else "")
