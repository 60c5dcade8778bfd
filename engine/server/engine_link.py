"""How the HTTP server reaches the engine: an :class:`EngineLink` sends generate
and cancel requests to a worker and hands each request's events to a sink.

Two links exist. :class:`WorkerLink` (here) owns a worker process of its own
for ``mtp-studio serve``, and restarts it (reloading the model) when it dies.
The app's link (``app/server_panel.py``) shares the chat's worker. The server
calls a link from its event-loop thread; sinks are called from the link's own
thread, so the server hands events over with ``call_soon_threadsafe``.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from engine.errors import EngineError
from engine.speculative.settings import SPECULATION_OFF, SpeculativeSettings
from engine.worker import protocol as P
from engine.worker.client import WorkerClient, WorkerDied

if TYPE_CHECKING:
    from engine.autotune.profiles import Profile, ProfileMatch

Sink = Callable[[P.Event], None]
PROBE_PREFIX = "ping-"  # the ids of responsiveness probes (cancels aimed at no request)
RESTART_NOTICE = "The engine process ended during this request ({why}); it is being restarted. Retry the request."


class EngineUnavailable(EngineError):
    """No engine can take a request now (it is restarting, or no model is loaded)."""

    kind = "engine_unavailable"


class EngineLink(Protocol):
    """What the server needs of an engine. Every method is safe from any thread."""

    def model(self) -> P.ModelInfo | None:
        """The loaded model, or None."""
        ...

    def default_speculative(self, concurrency: int = 1) -> SpeculativeSettings:
        """Speculation for a request that does not choose, starting with ``concurrency`` generations running
        (itself included): the model's autotune profile's choice for that many, or off."""
        ...

    def submit(self, request: P.GenerateRequestMsg | P.TokenizeRequest, sink: Sink) -> None:
        """Send ``request``; ``sink`` gets its events up to and including the final one.

        Raises:
            EngineUnavailable: nothing can take the request now.
        """
        ...

    def cancel(self, request_id: str) -> None:
        """Stop ``request_id`` (waiting or running); it still ends with its ``done`` event."""
        ...

    def new_id(self) -> str:
        ...

    def engine_build(self) -> P.EngineBuild | None:
        """The worker's engine build (the responses' ``system_fingerprint`` names it), None before the handshake."""
        ...

    def responsive(self, timeout_s: float) -> bool:
        """Does the engine answer within ``timeout_s`` (blocking; call it off the event loop)? False for
        a worker that is stopped (SIGSTOP) or frozen, which otherwise looks loaded and ready."""
        ...


class WorkerLink:
    """A worker process of the server's own, with the model loaded.

    A reader thread takes every event and routes it by request id to the
    sink registered for it. When the worker dies, every request in flight gets
    a final ``worker_died`` error, a fresh worker starts and the same model is
    loaded again; requests meanwhile are refused with :class:`EngineUnavailable`.
    """

    def __init__(self, load: P.LoadRequest, speculative: SpeculativeSettings = SPECULATION_OFF,
                 verbose: bool = False) -> None:
        self._load_request = load
        self._speculative = speculative
        self._by_concurrency: Callable[[int], SpeculativeSettings] | None = None
        self._stderr = sys.stderr if verbose else None
        self._lock = threading.Lock()
        self._sinks: dict[str, Sink] = {}
        self._ids = 0
        self._closed = False
        self.restarts = 0
        self._model: P.ModelInfo | None = None
        self.client = self._start()
        self.hello = self.client.hello
        threading.Thread(target=self._route, name="server-engine-events", daemon=True).start()

    # -- EngineLink ---------------------------------------------------------
    def model(self) -> P.ModelInfo | None:
        return self._model

    def default_speculative(self, concurrency: int = 1) -> SpeculativeSettings:
        model = self._model
        if model is None or not model.can_draft:
            return SPECULATION_OFF
        setting = self._by_concurrency(concurrency) if self._by_concurrency is not None else self._speculative
        return setting.limited_to(model.max_draft)

    def set_default_speculative(self, setting: SpeculativeSettings,
                                by_concurrency: Callable[[int], SpeculativeSettings] | None = None) -> None:
        """``setting`` for every request that does not choose, or ``by_concurrency(n)`` for one starting with
        n generations running (an autotune profile measured at several: one client alone may gain from
        drafting where four at once do not)."""
        self._speculative, self._by_concurrency = setting, by_concurrency

    def new_id(self) -> str:
        with self._lock:
            self._ids += 1
            return f"s{self._ids}"

    def engine_build(self) -> P.EngineBuild | None:
        return self.client.hello.engine

    def submit(self, request: P.GenerateRequestMsg | P.TokenizeRequest, sink: Sink) -> None:
        with self._lock:
            if self._model is None:
                raise EngineUnavailable("The engine is restarting after a crash; retry in a few seconds.")
            self._sinks[request.id] = sink
            try:
                self.client.send(request)
            except WorkerDied:
                self._sinks.pop(request.id, None)
                raise EngineUnavailable("The engine process has ended; it is being restarted. Retry.") from None
            except BaseException:  # not sent (text that cannot be encoded, …): the id must not stay taken
                self._sinks.pop(request.id, None)
                raise

    def cancel(self, request_id: str) -> None:
        with self._lock:
            if request_id not in self._sinks:
                return
            try:
                self.client.send(P.CancelRequest(id=f"c-{request_id}", target=request_id))
            except WorkerDied:
                pass  # the reader fails the request

    def responsive(self, timeout_s: float) -> bool:
        """A cancel aimed at no request, as a ping: the worker's reader thread answers it at once, even
        mid-reply, so no answer in ``timeout_s`` means the process is stopped or stuck."""
        answered = threading.Event()
        probe = f"{PROBE_PREFIX}{self.new_id()}"
        with self._lock:
            if self._model is None:
                return False
            self._sinks[probe] = lambda event: answered.set() if isinstance(event, P.AckEvent) else None
            try:
                self.client.send(P.CancelRequest(id=probe, target=probe))
            except WorkerDied:
                self._sinks.pop(probe, None)
                return False
        if answered.wait(timeout_s):
            return True
        with self._lock:
            self._sinks.pop(probe, None)  # a late answer finds no sink and is dropped
        return False

    # -- lifecycle ------------------------------------------------------------
    def _start(self) -> WorkerClient:
        """A fresh worker with the model loaded.

        Raises:
            EngineError: the model does not load (the message says why).
        """
        client = WorkerClient(stderr=self._stderr)
        loaded = client.call(self._load_request)[-1]
        if isinstance(loaded, P.ErrorEvent):
            client.close()
            raise EngineError(loaded.message)
        assert isinstance(loaded, P.LoadedEvent)
        self._model = loaded.model
        return client

    def close(self) -> None:
        self._closed = True
        self.client.close()

    def _route(self) -> None:
        """The reader: events to their sinks; a dead worker fails its requests and is replaced."""
        while not self._closed:
            try:
                event = self.client.next_event(timeout=None)
            except WorkerDied as exc:
                if self._closed:
                    return
                self._on_death(str(exc))
                continue
            sink = self._sinks.get(event.id or "")
            if sink is None:
                continue  # a cancel's ack, or a request whose client went away
            if P.is_final(event):
                with self._lock:
                    self._sinks.pop(event.id or "", None)
            sink(event)

    def _on_death(self, why: str) -> None:
        with self._lock:
            self._model = None
            orphans, self._sinks = self._sinks, {}
        for request_id, sink in orphans.items():
            sink(P.ErrorEvent(request_id, "worker_died", RESTART_NOTICE.format(why=why)))
        print(f"server: {why}; restarting the engine", file=sys.stderr)
        while not self._closed:
            try:
                client = self._start()
            except Exception as exc:  # keep the server up; it answers 503 until a start succeeds
                print(f"server: the engine did not restart: {exc}", file=sys.stderr)
                threading.Event().wait(2.0)
                continue
            with self._lock:
                self.client = client
                self.restarts += 1
            return


def load_request_for(path: str | None, *, sidecar: str | None = None, n_ctx: int = 4096, n_threads: int = 1,
                     n_gpu_layers: int = 0, mtp: bool = True, mmproj: str | None = None,
                     parallel: int = 1, draft_vocab: int = 0,
                     state_cache_mib: int = P.LoadOptions.state_cache_mib, swa_full: bool = False,
                     kv_unified: bool = True) -> P.LoadRequest:
    return P.LoadRequest(id="load", options=P.LoadOptions(path=path, n_ctx=n_ctx, n_threads=n_threads,
                                                          n_gpu_layers=n_gpu_layers, mtp=mtp, sidecar=sidecar,
                                                          mmproj=mmproj, parallel=parallel, draft_vocab=draft_vocab,
                                                          state_cache_mib=state_cache_mib, swa_full=swa_full,
                                                          kv_unified=kv_unified))


def find_profile(model_path: str) -> ProfileMatch:
    """The autotune profile for this model file, this machine and the engine build installed here, whatever
    sampling it was measured with (requests choose their own). Looked up before the model loads, since it
    may choose a load setting (the draft vocabulary); the build is read from its record, not by loading it.
    Probes the hardware in a short-lived child process (as the app does) for the fingerprint; hashes 16 MiB
    of the file."""
    from engine.autotune.profiles import ProfileStore
    from engine.hardware.probe import probe
    from engine.runtime.native import build_info

    return ProfileStore().lookup(model_path, probe().fingerprint(), P.EngineBuild(**build_info()).key,
                                 sampling=None)


def profile_speculative(model: P.ModelInfo, match: ProfileMatch, parallel: int = 1,
                        ) -> tuple[Profile | None, str]:
    """The speculation a profile (:func:`find_profile`) gives requests, and a line saying what it chose with
    ``parallel`` sequences at once (``serve --parallel N``; ``Profile.setting_for`` gives the choice for
    each number of generations running). The line names the sampling the profile was timed with.
    """
    from engine.sampling import sampling_label

    if not model.can_draft:
        return None, "this model has no MTP head: speculation off"
    profile = match.profile
    if profile is not None:
        setting = profile.setting_for(parallel)
        measured = max((n for n in profile.concurrency if n <= parallel), default=1)
        if measured == 1:
            why = profile.reason + (f"; measured alone, used with up to {parallel} at once" if parallel > 1 else "")
            at = ""
        else:
            why = f"{profile.concurrency[measured].speedup:.2f}x the total speed of off with {measured} at once"
            why += f"; alone: {profile.setting.label}" if setting != profile.setting else ""
            at = f" with {measured} or more at once"
        return profile, (f"autotune profile: {setting.label}{at} ({why}); timed with "
                         f"{sampling_label(profile.sampling)} sampling")
    stale = " (a profile exists for other hardware or another engine build: run mtp-studio autotune)" \
        if match.stale else ""
    return None, f"no autotune profile for this model{stale}: speculation off unless a request asks"
