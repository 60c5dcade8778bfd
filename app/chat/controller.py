"""The open conversation and what the user does with it: send, regenerate,
edit, continue, switch versions. Builds each request from the conversation;
the reply streams through ``app/chat/reply_stream.py`` into the transcript,
the statistics panel and the store.

A conversation may outgrow the model's context: the worker refuses a prompt
that does not fit and the chat asks again without the oldest turn
(``app/chat/context_fit.py``).

Editing a message starts a branch (``app/chat/versions.py``): the edited
text is a new version of the message, the old one keeps what followed it,
and ``‹1/2›`` on the message switches the whole branch below. Continue asks
for more of the last reply, from where Stop or the length limit ended it,
appended to the same reply.

The statistics panel (app/chat/stats_panel.py) gets the prompt's progress and the reply's figures; it
states MTP's speedup only where autotune measured it, and a model change clears the last model's figures.

On a full disk nothing is lost and the chat is never left busy
(app/chat/reply_saver.py): a message or an edit stays in the composer, and a
message with its empty reply row, or an edit's new version with its reply
row, is written in one write (``add_turn``, ``branch``), never half.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from PySide6.QtCore import QObject, Signal

from app.chat import written_by
from app.chat.attachments import Attachment
from app.chat.context_fit import Turn
from app.chat.image_request import with_images
from app.chat.reply_saver import ReplySaver, refusal
from app.chat.reply_stream import ReplyStream
from app.chat.shown_message import ShownMessage, shown
from app.chat.speculative_choice import speculative_for
from app.chat.stats_panel import StatsPanel
from app.chat.store import ConversationStore, Message, NotSaved
from app.chat.titles import title_from
from app.chat.transcript import TranscriptView
from app.engine_client import EngineClient
from app.models.presets import ModelPreset
from app.reply_values import ReplyValues, effective
from app.settings import Settings
from app.text_check import is_text
from engine.sampling import GREEDY_KEY, sampling_key
from engine.speculative.settings import SPECULATION_OFF, SpeculativeSettings
from engine.worker.events import ModelInfo


class ChatController(QObject):
    """Signals:
        sig_reply_started(): a reply began streaming.
        sig_reply_finished(str): it ended; the argument is the stored status.
        sig_notice(str): a message for the status bar.
        sig_context_notice(str): what the open chat's last reply left out to fit the context ("" for nothing).
        sig_conversation_opened(): another conversation (or none) is shown; what can be edited changed.
        sig_save_notice(str): why a reply is not saved yet ("" once it is).
        sig_version_shown(): another version is shown (a reply's, or a message's with its branch and title).
        sig_model_changed(object): the loaded model's ModelInfo (None: none); whether it takes images changed.
    """

    sig_reply_started = Signal()
    sig_reply_finished = Signal(str)
    sig_notice = Signal(str)
    sig_context_notice = Signal(str)
    sig_conversation_opened = Signal()
    sig_save_notice = Signal(str)
    sig_version_shown = Signal()
    sig_model_changed = Signal(object)

    def __init__(self, store: ConversationStore, client: EngineClient, transcript: TranscriptView,
                 stats_panel: StatsPanel, settings: Settings) -> None:
        super().__init__()
        self.store, self.client, self.transcript, self.stats_panel = store, client, transcript, stats_panel
        self.settings = settings
        self.conversation_id: int | None = None
        # the loaded model's preset (app/models/presets.py): over the preferences, under a chat's own settings
        self.model_preset = ModelPreset()
        self._profile: SpeculativeSettings | None = None  # from autotune, when there is one
        self.profile_speedup: float | None = None  # what autotune measured for it against plain decoding
        self.profile_sampling: str | None = None  # the sampling that was measured with (None: greedy, as of old)
        self.model_has_mtp = True  # "auto" asks for MTP only when the loaded model can draft
        self.model_has_vision = False  # images go to the model only when a projector is loaded with it
        self.model_name = ""  # the loaded model's file name, as a reply's footer says it
        self.saver = ReplySaver(store, self)
        self.saver.sig_notice.connect(self.sig_save_notice)
        self.saver.sig_saved.connect(lambda: self.sig_notice.emit("The reply waiting for disk space is saved."))
        self.stream = ReplyStream(client, transcript, stats_panel, self.saver, self._ask, self)
        self.stream.sig_finished.connect(self.sig_reply_finished)
        self.stream.sig_notice.connect(self.sig_notice)
        self.stream.sig_context_notice.connect(self.sig_context_notice)
        transcript.sig_version.connect(self.show_version)
        transcript.sig_continue.connect(self.continue_reply)

    @property
    def request_id(self) -> str | None:
        """The engine request of the reply streaming now (None when none is)."""
        return self.stream.request_id

    @property
    def dropped_messages(self) -> int:
        """How many of the oldest messages the open chat's last reply left out to fit the context."""
        return self.stream.dropped

    @property
    def context_size(self) -> int:
        """Tokens: the loaded model's n_ctx (0 before a model is loaded)."""
        return self.stream.context_size

    @property
    def profile_speculative(self) -> SpeculativeSettings | None:
        """The autotune profile's settings for the loaded model ("auto" uses them)."""
        return self._profile

    @profile_speculative.setter
    def profile_speculative(self, setting: SpeculativeSettings | None) -> None:
        # another profile (or none): its measured speedup is set after it, never kept from the last one
        self._profile = setting
        self.profile_speedup = None
        self.profile_sampling = None

    # -- conversations ------------------------------------------------------
    def set_model(self, model: ModelInfo | None) -> None:
        """The model loaded now (None: none): images are sent only to one with a vision projector."""
        self.model_has_vision = model is not None and model.vision
        # what a reply's footer names (app/chat/written_by.py)
        self.model_name = "" if model is None else "built-in model" if model.is_default_model else Path(model.path).name
        self.sig_model_changed.emit(model)

    def model_loaded(self, n_ctx: int) -> None:
        """A model was loaded with ``n_ctx`` tokens of context: another size or
        tokenizer may fit what was left out before, so the next reply tries it all.
        The statistics shown were the previous model's: they are cleared."""
        self.stream.context_size = n_ctx
        self.stream.cut = None
        self.stream.last_stats = None
        if not self.busy:
            self.stats_panel.reset()

    def open(self, conversation_id: int, but: int | None = None) -> None:
        """Show a conversation (without message ``but``: a reply about to stream)."""
        self.conversation_id = conversation_id
        self.stream.cut, self.stream.dropped = None, 0
        self.sig_context_notice.emit("")
        stored = [m for m in self.store.messages(conversation_id) if m.id != but]
        shown = [self._shown(m, i == len(stored) - 1) for i, m in enumerate(stored)]
        self.transcript.system_prompt = self.store.get(conversation_id).system_prompt  # shown above the messages
        self.transcript.set_messages(shown)
        self.stats_panel.show_last(shown)
        self.sig_conversation_opened.emit()

    def _shown(self, m: Message, last: bool) -> ShownMessage:
        """``m`` as the transcript shows it (app/chat/shown_message.py)."""
        return shown(m, last, self.saver.waiting_for(m.id), self.images_of(m), self.chat_values().max_tokens)

    def images_of(self, m: Message) -> tuple[Attachment, ...]:
        """The images attached to ``m`` that the store holds."""
        return tuple(a for a in (self.store.image(h) for h in m.images) if a is not None)

    def close_conversation(self) -> None:
        """Show no conversation (the open one was deleted)."""
        self.conversation_id = None
        self.transcript.system_prompt = ""
        self.stream.cut, self.stream.dropped = None, 0
        self.sig_context_notice.emit("")
        self.transcript.set_messages([])
        self.stats_panel.reset()
        self.sig_conversation_opened.emit()

    def new_conversation(self) -> int:
        preset_prompt = self.model_preset.system_prompt
        conv = self.store.create(system_prompt=self.settings.system_prompt if preset_prompt is None else preset_prompt)
        self.open(conv.id)
        return conv.id

    @property
    def busy(self) -> bool:
        return self.request_id is not None

    # -- a turn -----------------------------------------------------------------
    def send(self, text: str, images: tuple[Attachment, ...] = ()) -> bool:
        """Store the user's message (with its attached ``images``) and ask the engine for a reply."""
        return self._send(text, images=images)

    def _send(self, text: str, edit: int | None = None, images: tuple[Attachment, ...] = ()) -> bool:
        """Store ``text`` and ``images`` (as a new version of message ``edit``, a branch) and ask for a reply.

        False, with the reason on the status bar, when nothing was stored or asked: the caller
        keeps the text (it stays in the composer)."""
        text = text.strip()
        if not (text or images) or self.busy:
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
            earlier = [m for m in self.store.messages(self.conversation_id) if edit is None or m.id < edit]
            title = None if earlier else title_from(text or "Image")
            user, reply = (self.store.add_turn(self.conversation_id, text, title=title, images=images) if edit is None
                           else self.store.branch(edit, text, title=title, images=images))
        except NotSaved as exc:  # the message stays in the composer; nothing was sent
            self.sig_notice.emit(refusal(exc, "the message was not sent. Free some space and send it again."))
            return False
        if edit is not None:
            self.open(self.conversation_id, but=reply.id)  # the new branch shows; its reply streams below
        else:
            self.transcript.append(ShownMessage("user", text, id=user.id, images=images))
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
            self.transcript.pop()
        self._start_reply(reply)

    def continue_reply(self) -> bool:
        """Ask for more of the last reply, from where it ended (Stop, the length limit, a dead engine),
        appended to it. False when there is no reply to continue or the disk refused."""
        if self.busy or self.conversation_id is None:
            return False
        msgs = self.store.messages(self.conversation_id)
        if not msgs or msgs[-1].role != "assistant" or not msgs[-1].content:
            return False
        try:
            self.saver.write_waiting()  # the reply's newest text is the one continued
            self.store.update_message(msgs[-1].id, status="streaming")
        except NotSaved as exc:
            self.sig_notice.emit(refusal(exc, "the reply was not continued. Free some space and try again."))
            return False
        self._start_reply(self.store.message(msgs[-1].id), continuing=True)
        return True

    def user_message_at(self, index: int | None = None) -> Message | None:
        """The stored user message shown at transcript position ``index`` (None: the last one, what "Edit last"
        edits); None while replying, or for another kind of message. Nothing changes until an edit is sent."""
        if self.busy or self.conversation_id is None:
            return None
        stored = self.store.messages(self.conversation_id)
        if index is None:
            return next((m for m in reversed(stored) if m.role == "user"), None)
        shown = self.transcript.messages[index] if 0 <= index < len(self.transcript.messages) else None
        wanted = shown.id if shown is not None and shown.role == "user" else None
        return next((m for m in stored if m.id == wanted), None) if wanted is not None else None

    def send_edited(self, message_id: int, text: str, images: tuple[Attachment, ...] = ()) -> bool:
        """Send ``text`` as a new version of the edited message, a branch: what followed the old
        version is kept with it (‹1/2› switches back). Refused (False, nothing changed) when
        ``text`` cannot be sent or stored."""
        if not (text.strip() or images) or self.busy or self.conversation_id is None:
            return False
        if not any(m.id == message_id and m.role == "user" for m in self.store.messages(self.conversation_id)):
            return self.send(text, images)  # another chat was opened meanwhile: a new message
        return self._send(text, edit=message_id, images=images)

    def show_version(self, index: int, step: int) -> None:
        """Show the previous (``step`` -1) or next (+1) version of the message at transcript position
        ``index``; a user message's comes with its branch, the conversation that followed it."""
        shown = self.transcript.messages[index] if 0 <= index < len(self.transcript.messages) else None
        if self.busy or shown is None or shown.id is None or self.conversation_id is None:
            return
        try:
            self.saver.write_waiting()  # the shown version's newest text goes into the versions first
            m = self.store.select_version(shown.id, shown.version + step)
        except NotSaved as exc:  # the version shown is the one stored: nothing changes
            self.sig_notice.emit(refusal(exc, "the other version was not shown (the version shown is saved with "
                                              "the chat). Free some space and try again."))
            return
        if m.role == "user":
            self.open(self.conversation_id)  # another branch below it (its statistics with it)
        else:
            self.transcript.replace(index, self._shown(m, len(self.transcript.messages) - 1 == index))
            self.stats_panel.show_last(self.transcript.messages)  # the panel tells of the version shown
        self.sig_version_shown.emit()  # the chat list's title and Continue follow the branch

    def stop(self) -> None:
        self.stream.stop()

    def chat_values(self) -> ReplyValues:
        """This conversation's settings over the loaded model's preset over the app's preferences."""
        chat = self.store.get(self.conversation_id).settings if self.conversation_id is not None else {}
        preferences = self.settings.reply_values()
        if self.model_preset.sampling is not None:
            preferences = replace(preferences, sampling=self.model_preset.sampling)
        return effective(preferences, chat)

    def speculative_settings(self, values: ReplyValues | None = None) -> SpeculativeSettings:
        """What this reply asks of the engine: the choice made into settings (app/chat/speculative_choice.py)."""
        try:
            return speculative_for(values or self.chat_values(), self.profile_speculative, self.model_has_mtp)
        except ValueError as exc:  # a hand-edited settings file: say so, and reply anyway
            self.sig_notice.emit(f"The speculative settings are not valid ({exc}); this reply decodes plainly.")
            return SPECULATION_OFF

    def _start_reply(self, reply: Message, continuing: bool = False) -> None:
        """Ask for ``reply`` (its row is stored, ``streaming``: empty, or with the text ``continuing`` goes on
        from) from the conversation before it."""
        assert self.conversation_id is not None
        conv = self.store.get(self.conversation_id)
        history = [m for m in self.store.messages(self.conversation_id) if (m.content or m.images) and m.id != reply.id]
        self.stream.start(reply, Turn(conv.system_prompt, history + ([reply] if continuing else []),
                                      continuing=continuing))
        self.sig_reply_started.emit()

    def _ask(self, turn: Turn) -> str:
        """Send the turn, as far as it is kept, to the engine; returns the request's id."""
        v = self.chat_values()
        speculative = self.speculative_settings(v)
        self.stream.author = {"model": self.model_name, "sampling": written_by.sampling_words(v.sampling)}
        measured = speculative == self._profile and speculative.enabled and self.profile_speedup
        # the figure holds for the sampling autotune measured with; the panel says so for another one
        self.stats_panel.set_speedup(self.profile_speedup if measured else None, "autotuned",
                                     measured_with=self.profile_sampling or GREEDY_KEY,
                                     sampling=sampling_key(v.sampling))
        asked = with_images(turn, self.store.image, self.model_has_vision)
        if asked.left_out:
            self.sig_notice.emit(f"{asked.left_out} image(s) in this chat were not sent: the model has no vision "
                                 "projector loaded (load one with the model: Models → pair panel).")
        return self.client.generate(
            messages=asked.messages, max_tokens=v.max_tokens, speculative=speculative,
            continue_final_message=turn.continuing,
            sampling=v.sampling, template=self.model_preset.chat_template, images=asked.images,
        )

