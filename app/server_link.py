"""The local server's way into the chat's engine: an
:class:`~engine.server.engine_link.EngineLink` over the app's
:class:`~app.engine_client.EngineClient`, so the server and the chat share one
worker and one loaded model.

How they share it without corrupting each other's state:
- Every request carries its own id: the server's are ``h1, h2, …``, the chat's
  ``q1, q2, …``. The chat reads only events of its own request id, this link
  only events of the server's, and a cancel names its target id.
- With one sequence (``Settings.parallel`` 1, or Auto where only one fits) the worker runs generate requests
  one at a time, in the order they arrive: a server request sent while the chat
  is replying waits until that reply ends, and the other way round (the
  server's own queue bounds how many of its requests wait). With more, the
  model is loaded with that many sequences and the worker decodes the chat's
  reply and the server's requests together (engine/worker/together.py).
- Loads go through the same queue, so a model switch happens between replies;
  the server then serves the new model (``/v1/models`` follows it).
- If the worker dies, in-flight server requests end with a ``worker_died``
  error, and ``on_death`` (the panel passes the app's engine restart) brings a
  fresh worker; the app reloads the model as after any restart.

The server calls ``submit`` and ``cancel`` from its own thread: they are
handed to the GUI thread with a queued signal; events go back through the
sink (the server's ``call_soon_threadsafe``).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable

from PySide6.QtCore import QObject, Qt, Signal

from app.engine_client import SERVER_ID_PREFIX, EngineClient
from engine.errors import ProtocolError
from engine.server.engine_link import PROBE_PREFIX, EngineUnavailable, Sink
from engine.speculative.settings import SPECULATION_OFF, SpeculativeSettings
from engine.worker import protocol as P


class ChatEngineLink(QObject):
    """Lives on the GUI thread; ``model``, ``default_speculative``, ``submit``, ``cancel`` and ``new_id``
    are safe from the server's thread."""

    _sig_send = Signal(object)
    sig_in_flight = Signal(int)  # the server's requests sent to the worker and not ended yet (GUI thread)

    def __init__(self, client: EngineClient, profile: Callable[[], SpeculativeSettings | None],
                 on_death: Callable[[], None] | None = None, model: P.ModelInfo | None = None,
                 parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.client = client
        self._profile = profile
        self.on_death = on_death
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._sinks: dict[str, Sink] = {}
        self._model: P.ModelInfo | None = model  # loaded before the link was made
        self._sig_send.connect(self._send, Qt.ConnectionType.QueuedConnection)
        for signal in (client.sig_token, client.sig_stats, client.sig_done, client.sig_error, client.sig_prefill,
                       client.sig_ack, client.sig_tokens):
            signal.connect(self._route)
        client.sig_loaded.connect(lambda ev: self._set_model(ev.model))
        client.sig_unloaded.connect(lambda _ev: self._set_model(None))
        client.sig_died.connect(self._died)

    # -- EngineLink (any thread) ----------------------------------------------
    def model(self) -> P.ModelInfo | None:
        return self._model

    def default_speculative(self, concurrency: int = 1) -> SpeculativeSettings:
        """The model's autotune profile (as the chat's "auto" uses it), else off; the same at any
        ``concurrency`` (the chat's profile is the one measured alone)."""
        model, profile = self._model, self._profile()
        if model is None or not model.can_draft or profile is None:
            return SPECULATION_OFF
        return profile.limited_to(model.max_draft)

    def new_id(self) -> str:
        with self._lock:
            return f"{SERVER_ID_PREFIX}{next(self._ids)}"

    def engine_build(self) -> P.EngineBuild | None:
        return self.client.engine

    def responsive(self, timeout_s: float) -> bool:
        """A cancel aimed at no request, as a ping (as ``WorkerLink.responsive``). Its answer comes back
        through the GUI thread, so a stuck GUI thread reads as unresponsive too: the server's requests
        could not pass it either."""
        answered = threading.Event()
        probe = f"{PROBE_PREFIX}{self.new_id()}"
        with self._lock:
            if self._model is None:
                return False
            self._sinks[probe] = lambda event: answered.set() if isinstance(event, P.AckEvent) else None
        self._sig_send.emit(P.CancelRequest(id=probe, target=probe))
        if answered.wait(timeout_s):
            return True
        with self._lock:
            self._sinks.pop(probe, None)  # a late answer finds no sink and is dropped
        return False

    def submit(self, request: P.GenerateRequestMsg | P.TokenizeRequest, sink: Sink) -> None:
        """Raises:
            EngineUnavailable: no model is loaded, or the engine is restarting.
            ProtocolError: the request's text cannot be encoded (refused here, on the server's thread,
                so the caller can answer; on the GUI thread it would only print a traceback).
        """
        try:
            P.encode(request).encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ProtocolError(f"the request's text is not valid Unicode ({exc.reason} at offset {exc.start}); "
                                "it was not sent") from None
        with self._lock:
            if self._model is None:
                raise EngineUnavailable("No model is loaded in MTP Studio (or the engine is restarting).")
            self._sinks[request.id] = sink
        self._sig_send.emit(request)

    def cancel(self, request_id: str) -> None:
        with self._lock:
            if request_id not in self._sinks:
                return
        self._sig_send.emit(P.CancelRequest(id=f"c-{request_id}", target=request_id))

    # -- GUI thread ---------------------------------------------------------------
    def in_flight(self) -> int:
        """How many of the server's requests wait for their end (the status bar shows it)."""
        with self._lock:
            return sum(not rid.startswith(PROBE_PREFIX) for rid in self._sinks)

    def _send(self, message: object) -> None:
        """Write ``message`` to the worker. If that fails, end a generate request here with an error and
        ``done``: its sink waits for a final event, and the server's queue with it."""
        if isinstance(message, P.GenerateRequestMsg | P.TokenizeRequest):
            self.sig_in_flight.emit(self.in_flight())
        try:
            self.client.send(message)
        except Exception as exc:
            if isinstance(message, P.TokenizeRequest):
                self._route(P.ErrorEvent(message.id, "internal", f"The request could not be sent to the engine: "
                                         f"{exc}"))
                return
            if not isinstance(message, P.GenerateRequestMsg):
                raise
            self._route(P.ErrorEvent(message.id, "internal", f"The request could not be sent to the engine: "
                                     f"{exc}", final=False))
            self._route(P.DoneEvent(message.id, finish_reason="error"))

    def _set_model(self, model: P.ModelInfo | None) -> None:
        self._model = model

    def _route(self, event: P.Event) -> None:
        with self._lock:
            sink = self._sinks.get(event.id or "")
            if sink is not None and P.is_final(event):
                del self._sinks[event.id or ""]
        if sink is not None:
            sink(event)
            if P.is_final(event):
                self.sig_in_flight.emit(self.in_flight())

    def _died(self, reason: str) -> None:
        with self._lock:
            self._model = None
            orphans, self._sinks = self._sinks, {}
        for request_id, sink in orphans.items():
            sink(P.ErrorEvent(request_id, "worker_died", f"The engine process ended ({reason}); it is being "
                              "restarted. Retry the request."))
        self.sig_in_flight.emit(0)
        if self.on_death is not None:
            self.on_death()
