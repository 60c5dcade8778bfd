"""The GUI's connection to the engine worker: a child process speaking the
worker protocol, its events decoded into typed events and sent on as Qt
signals.

The worker may die at any moment (a native abort, an out-of-memory kill, a
SIGILL from a wrong engine build); the client notices, says why in words,
and can start a fresh worker. It never blocks the GUI thread.
"""

from __future__ import annotations

import dataclasses
import itertools
import sys
from typing import Any

from PySide6.QtCore import QObject, QTimer, Signal

from app.process import ChildProcess, ProcessOutcome
from engine.errors import ProtocolError
from engine.sampling import GREEDY, SamplingParams
from engine.speculative.settings import MAX_DRAFT, SpeculativeSettings
from engine.unicode_text import first_bad_text, printable
from engine.worker import protocol as P

SERVER_ID_PREFIX = "h"  # the local server's requests on this worker (app/server_link.py)


class EngineClient(QObject):
    """Owns one worker process.

    Signals:
        sig_ready(ReadyEvent): the handshake arrived (protocol version, engine build, limits).
        sig_loaded(LoadedEvent): a model is loaded; ``event.model`` describes it.
        sig_unloaded(UnloadedEvent): the model was ejected; nothing is loaded.
        sig_prefill(PrefillEvent): how much of a reply's prompt the engine has read.
        sig_token(TokenEvent): a text delta of a reply.
        sig_stats(StatsEvent): live statistics of a reply.
        sig_done(DoneEvent): a reply ended.
        sig_error(ErrorEvent): the worker (or this client) reports an error.
        sig_ack(AckEvent): a cancel reached the worker (``target``: the request it stopped, or null).
        sig_died(str): the worker ended unexpectedly; the text says why.
        sig_state(str): "starting" | "ready" | "loading" | "busy" | "dead" | "stopped".
    """

    sig_ready = Signal(object)
    sig_loaded = Signal(object)
    sig_unloaded = Signal(object)
    sig_prefill = Signal(object)
    sig_token = Signal(object)
    sig_stats = Signal(object)
    sig_done = Signal(object)
    sig_error = Signal(object)
    sig_ack = Signal(object)
    sig_tokens = Signal(object)  # TokensEvent: the answer to a tokenize request (the local server's)
    sig_died = Signal(str)
    sig_state = Signal(str)

    HANDSHAKE_TIMEOUT_MS = int(P.HANDSHAKE_TIMEOUT_S * 1000)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._ids = itertools.count(1)
        self._proc = ChildProcess("the engine process", self)
        self._proc.sig_lines.connect(self._on_lines)
        self._proc.sig_finished.connect(self._on_finished)
        self.state = "stopped"
        self.hello: P.ReadyEvent | None = None
        self._handshake_timer = QTimer(self)
        self._handshake_timer.setSingleShot(True)
        self._handshake_timer.timeout.connect(self._on_handshake_timeout)
        self._signals = {P.LoadedEvent: self.sig_loaded, P.TokenEvent: self.sig_token,
                         P.StatsEvent: self.sig_stats, P.DoneEvent: self.sig_done,
                         P.UnloadedEvent: self.sig_unloaded, P.PrefillEvent: self.sig_prefill,
                         P.AckEvent: self.sig_ack, P.TokensEvent: self.sig_tokens}

    @property
    def engine(self) -> P.EngineBuild | None:
        return self.hello.engine if self.hello else None

    @property
    def max_draft(self) -> int:
        """The deepest ``n_max`` the engine drafts, as its handshake reports it."""
        return self.hello.max_draft if self.hello else MAX_DRAFT

    @property
    def pid(self) -> int | None:
        return self._proc.pid

    # -- lifecycle ----------------------------------------------------------
    def start(self) -> None:
        if self._proc.running:
            return
        self.hello = None
        self._set_state("starting")
        self._proc.start(["-m", "engine.worker"])
        self._handshake_timer.start(self.HANDSHAKE_TIMEOUT_MS)

    def restart(self) -> None:
        self.stop(wait_ms=2000)
        self.start()

    def stop(self, wait_ms: int = 3000) -> None:
        if self._proc.running:
            farewell = (P.encode(P.ShutdownRequest(id=self._new_id())) + "\n").encode("utf-8")
            self._proc.stop(wait_ms, farewell=farewell)
        self._handshake_timer.stop()
        self._set_state("stopped")

    # -- requests ---------------------------------------------------------
    def load(self, options: P.LoadOptions) -> str:
        rid = self._new_id()
        self._write(P.LoadRequest(id=rid, options=options))
        self._set_state("loading")
        return rid

    def unload(self) -> str:
        """Eject the model (the worker answers ``unloaded``); it frees the model's memory."""
        rid = self._new_id()
        self._write(P.UnloadRequest(id=rid))
        return rid

    def generate(self, *, messages: list[dict[str, str]] | None = None, prompt: str | None = None,
                 speculative: SpeculativeSettings, max_tokens: int, sampling: SamplingParams = GREEDY,
                 continue_final_message: bool = False, template: str | None = None,
                 images: list[str] | None = None) -> str:
        """``template``: a chat template over the model's own (a model preset's), None for the model's;
        ``images``: base64 encoded images, one per ``IMAGE_MARKER`` in the messages' text, in order."""
        rid = self._new_id()
        self._write(P.GenerateRequestMsg(id=rid, messages=messages, prompt=prompt, speculative=speculative,
                                         max_tokens=max_tokens, sampling=sampling,
                                         continue_final_message=continue_final_message, template=template,
                                         images=list(images or ())))
        self._set_state("busy")
        return rid

    def tokenize(self, text: str) -> str:
        """Count ``text`` in the loaded model's tokens; the answer is a ``tokens`` event (``sig_tokens``)."""
        rid = self._new_id()
        self._write(P.TokenizeRequest(id=rid, text=text))
        return rid

    def cancel(self, rid: str | None = None) -> None:
        self._write(P.CancelRequest(id=self._new_id(), target=rid))

    def send(self, message: Any) -> None:
        """Send a request made elsewhere with its own id (the local server's,
        ``app/server_link.py``); its events arrive on the same signals."""
        self._write(message)

    # -- internals ----------------------------------------------------------
    def _new_id(self) -> str:
        return f"q{next(self._ids)}"

    def _write(self, message: Any) -> None:
        line = P.encode(message) + "\n"
        try:
            data = line.encode("utf-8")
        except UnicodeEncodeError:
            self._refuse(message, unsendable_text(message))
            return
        if not self._proc.write(data):
            self.sig_error.emit(P.ErrorEvent(getattr(message, "id", None), "worker_died",
                                             "The engine is not running. Restart it from the banner."))

    def _refuse(self, message: Any, why: str) -> None:
        """Answer ``message`` here as the worker answers a request it refuses, once the caller holds its id
        (the answer comes from the event loop, not from inside the call that made the request): a generate
        request ends with an error and ``done``, a load with a load error, anything else with an error."""
        rid = getattr(message, "id", None)
        if isinstance(message, P.GenerateRequestMsg):
            answer: list[Any] = [P.ErrorEvent(rid, "protocol", why, final=False), P.DoneEvent(rid, "error")]
        elif isinstance(message, P.LoadRequest):
            answer = [P.ErrorEvent(rid, "model_file", why)]
        else:
            answer = [P.ErrorEvent(rid, "protocol", why)]
        QTimer.singleShot(0, self, lambda: [self._deliver(ev) for ev in answer])

    def _set_state(self, state: str) -> None:
        if state != self.state:
            self.state = state
            self.sig_state.emit(state)

    def _on_lines(self, lines: list[bytes]) -> None:
        for line in lines:
            if line.strip():
                self._dispatch(line)

    def _dispatch(self, line: bytes) -> None:
        try:
            ev = P.decode_event(line)
        except ProtocolError as exc:
            self.sig_error.emit(P.ErrorEvent(None, exc.kind, str(exc)))
            return
        self._deliver(ev)

    def _deliver(self, ev: Any) -> None:
        """Send an event on as its signal, keeping the state as the events say (a reply or a load ended)."""
        signal = self._signals.get(type(ev))
        if signal is not None:  # the hot path: tokens and statistics
            if isinstance(ev, P.LoadedEvent | P.DoneEvent) and not (ev.id or "").startswith(SERVER_ID_PREFIX):
                self._set_state("ready")  # not for the local server's requests: the chat may still be replying
            signal.emit(ev)
        elif isinstance(ev, P.ReadyEvent):
            self._on_ready(ev)
        elif isinstance(ev, P.ErrorEvent):
            if ev.final and self.state == "loading":
                self._set_state("ready")
            self.sig_error.emit(ev)

    def _on_ready(self, ev: P.ReadyEvent) -> None:
        self._handshake_timer.stop()
        if ev.protocol != P.PROTOCOL_VERSION:
            self.sig_error.emit(P.ErrorEvent(None, "protocol", f"The engine speaks protocol {ev.protocol}; "
                                             f"this app needs {P.PROTOCOL_VERSION}. Reinstall MTP Studio."))
            self.stop()
            return
        self.hello = ev
        self._set_state("ready")
        self.sig_ready.emit(ev)

    def _on_finished(self, outcome: ProcessOutcome) -> None:
        self._handshake_timer.stop()
        if outcome.expected:
            return
        if not outcome.started:
            reason = f"The engine could not start ({sys.executable} -m engine.worker)."
        else:
            reason = str(outcome)
            if outcome.last_error:
                reason += f". Last message: {outcome.last_error}"
            reason = reason[0].upper() + reason[1:]
        self._set_state("dead")
        self.sig_died.emit(reason)

    def _on_handshake_timeout(self) -> None:
        if self.state == "starting":
            self.stop(wait_ms=500)
            self._set_state("dead")
            self.sig_died.emit(
                f"The engine did not answer within {P.HANDSHAKE_TIMEOUT_S:.0f} s of starting. "
                "Restart it; if this repeats, rebuild the engine (packaging/build_engine.py)."
            )


def unsendable_text(message: Any) -> str:
    """What the user is told about a request whose text cannot go down the worker's pipe (UTF-8 JSON):
    a lone surrogate, from a broken paste or a file name that is not UTF-8 (Python decodes its bytes
    into surrogates), names the field it is in."""
    data = dataclasses.asdict(message) if dataclasses.is_dataclass(message) and not isinstance(message, type) \
        else message
    bad = first_bad_text(data)
    where = f"'{bad.path}' holds a character that is not valid text ({bad.char} at offset {bad.offset})" \
        if bad is not None else "it holds a character that is not valid text"
    if isinstance(message, P.LoadRequest):
        o = message.options
        files = (("model file", o.path), ("MTP sidecar", o.sidecar), ("vision projector", o.mmproj))
        named = next(((label, name) for label, name in files if name and first_bad_text(name) is not None), None)
        if named is not None:
            where = f"the {named[0]}'s name ({printable(named[1])}) is not valid text"
        return (f"The model was not loaded: {where}, as a file or folder name that is not UTF-8 is. "
                "Rename it and choose it again.")
    return (f"The request was not sent to the engine: {where}, as a broken paste can leave. "
            "Remove the character and try again.")
