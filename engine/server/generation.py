"""One HTTP request's generation: its place in the queue, its events from the
engine link, its deadline, and what is left to do when its client goes away.

The queue (:class:`Gate`) lets ``parallel`` generations run at once (the
worker decodes them together when the model was loaded with as many
sequences; engine/worker/together.py), in arrival order, with at most
``max_queue`` waiting; a request beyond that is refused at once with 503 and
``Retry-After``. A generation holds the gate until its
final event arrives, even after its client left: it is cancelled in the
worker, and a background task reads it to its end, so the next request never
starts while the worker still decodes an abandoned one. A submit that fails
in any way gives the gate back at once: one bad request must never lock the
server for the ones after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from dataclasses import dataclass

from engine.errors import ProtocolError
from engine.server.config import ServerConfig
from engine.server.engine_link import EngineLink, EngineUnavailable
from engine.server.metrics import Metrics, RequestRecord
from engine.server.openai_format import ApiError
from engine.speculative.settings import SpeculativeSettings
from engine.worker import protocol as P

DRAIN_TIMEOUT_S = 60.0  # an abandoned generation must end this soon after its cancel, or the gate opens anyway


class Gate:
    """``parallel`` generations at a time, first come first served, a bounded queue behind them."""

    def __init__(self, config: ServerConfig, metrics: Metrics) -> None:
        self.config, self.metrics = config, metrics
        self._lock = asyncio.Semaphore(config.parallel)  # wakes its waiters in FIFO order
        self.admitted = 0  # running + waiting

    def admit(self) -> None:
        """Take a place in line, or refuse with 503 when the queue is full."""
        if self.admitted >= self.config.parallel + self.config.max_queue:
            running = "one request is" if self.config.parallel == 1 else f"{self.config.parallel} requests are"
            raise ApiError(503, f"The server is busy: {running} running and {self.config.max_queue} are "
                           "waiting. Retry later.", code="server_busy", type_="server_error",
                           headers={"Retry-After": str(self.config.retry_after_s)})
        self.admitted += 1
        self.metrics.deferred += 1

    async def wait_turn(self) -> None:
        try:
            await asyncio.wait_for(self._lock.acquire(), self.config.queue_timeout_s)
        except TimeoutError:
            raise ApiError(503, f"The request waited {self.config.queue_timeout_s:g} s for its turn; the server "
                           "is busy. Retry later.", code="queue_timeout", type_="server_error",
                           headers={"Retry-After": str(self.config.retry_after_s)}) from None
        finally:
            self.metrics.deferred -= 1

    def concurrency_next(self) -> int:
        """Generations running once the next request starts, itself included (it may wait for a turn
        first: then as many as run at once)."""
        return min(self.config.parallel, self.admitted + 1)

    def leave(self) -> None:
        self.admitted -= 1

    def give_back_turn(self) -> None:
        self._lock.release()


class _Handoff:
    """Events from the link's thread into the loop's queue. One wake-up of the loop carries every event
    that arrived since the last (an MTP round delivers several tokens at once), not one per event."""

    def __init__(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[P.Event | None]) -> None:
        self.loop, self.queue = loop, queue
        self._lock = threading.Lock()
        self._pending: list[P.Event] = []

    def put(self, event: P.Event) -> None:  # the link's thread
        with self._lock:
            self._pending.append(event)
            if len(self._pending) > 1:
                return  # a wake-up is already on its way
        with contextlib.suppress(RuntimeError):  # the server stopped and its loop closed: nobody waits
            self.loop.call_soon_threadsafe(self._flush)

    def _flush(self) -> None:  # the loop's thread
        with self._lock:
            events, self._pending = self._pending, []
        for event in events:
            self.queue.put_nowait(event)


@dataclass
class Outcome:
    """How a generation ended, for the response and the request log."""

    finish: str = "error"  # stop | length | cancelled | error
    text: str = ""
    n_tokens: int = 0
    stats: P.StatsSnapshot | None = None
    error: P.ErrorEvent | None = None
    notes: tuple[str, ...] = ()
    logprobs: list[P.TokenLogprobs] | None = None
    stop: str | None = None  # the stop string that ended it
    reasoning: str = ""  # the reply's thinking block (with split_reasoning)


class Generation:
    """A request on its way through the gate and the engine link, read as events."""

    def __init__(self, link: EngineLink, gate: Gate, config: ServerConfig, metrics: Metrics,
                 endpoint: str, stream: bool) -> None:
        self.link, self.gate, self.config, self.metrics = link, gate, config, metrics
        self.endpoint, self.stream = endpoint, stream
        self.id = link.new_id()
        self.events: asyncio.Queue[P.Event | None] = asyncio.Queue()  # None: the deadline passed
        self._timer: asyncio.TimerHandle | None = None
        self.outcome = Outcome()
        self.speculative: SpeculativeSettings | None = None
        self.t0 = time.monotonic()
        self._running = False
        self._left = False
        self._turn_given_back = False
        self._recorded = False
        self.finished = False
        self.status = 200
        self.end_reason: str | None = None  # disconnected | timeout, when the server ended it

    # -- start ----------------------------------------------------------------
    async def start(self, request: P.GenerateRequestMsg) -> None:
        """Wait for the turn (the place in line is taken by the caller's :meth:`Gate.admit`), then submit."""
        try:
            await self.gate.wait_turn()
        except BaseException:
            self._leave()
            raise
        self._running = True
        self.metrics.processing += 1
        if self.end_reason is not None:  # abandoned while its turn came (a cancel can race the lock): give it up
            self._leave()
            raise asyncio.CancelledError()
        self.speculative = request.speculative
        loop = asyncio.get_running_loop()
        try:
            self.link.submit(request, _Handoff(loop, self.events).put)
        except BaseException as exc:  # whatever the submit raised, nothing runs: give back what this holds
            self.finished = True
            self._leave()
            if isinstance(exc, EngineUnavailable):
                raise ApiError(503, str(exc), code="engine_unavailable", type_="server_error",
                               headers={"Retry-After": str(self.config.retry_after_s)}) from None
            if isinstance(exc, ProtocolError):  # text or a value the worker cannot take: the request's fault
                raise ApiError(400, str(exc), code="invalid_request") from None
            raise
        # one timer for the whole request, not a wait_for per token (that makes a task per event)
        self._timer = loop.call_later(self.config.request_timeout_s, self.events.put_nowait, None)

    # -- events ---------------------------------------------------------------
    async def next_event(self) -> P.Event:
        """The next event; a final one ends the generation.

        Raises:
            ApiError: 504 when the request ran past its timeout (it is cancelled).
        """
        event = await self.events.get()
        if event is None:
            self.abandon("timeout")
            raise ApiError(504, f"The generation ran past the request timeout ({self.config.request_timeout_s:g} s) "
                           "and was cancelled.", code="timeout", type_="server_error")
        self._note(event)
        return event

    def ready_events(self) -> list[P.Event]:
        """Events already here, taken without waiting (a stream writes them in one go)."""
        ready: list[P.Event] = []
        while not self.finished and not self.events.empty():
            event = self.events.get_nowait()
            if event is None:  # the deadline: left for next_event to report
                self.events.put_nowait(None)
                break
            self._note(event)
            ready.append(event)
        return ready

    def _note(self, event: P.Event) -> None:
        out = self.outcome
        if isinstance(event, P.TokenEvent) and event.reasoning:
            out.reasoning += event.text
        elif isinstance(event, P.TokenEvent):
            out.text += event.text
        elif isinstance(event, P.StatsEvent):
            out.stats = event.stats
        elif isinstance(event, P.ErrorEvent):
            if event.final or event.kind != "speculative_unavailable":
                out.error = out.error or event
            else:
                out.notes += (event.message,)
        if isinstance(event, P.DoneEvent):
            out.finish, out.n_tokens, out.logprobs, out.stop = (event.finish_reason, event.n_tokens, event.logprobs,
                                                                event.stop)
            out.stats = event.stats or out.stats
        if P.is_final(event):
            if isinstance(event, P.ErrorEvent):
                out.finish = "error"
            self._end()

    def _end(self) -> None:
        self.finished = True
        if self._timer is not None:
            self._timer.cancel()
        if self.outcome.stats is not None and self.outcome.n_tokens:
            self.metrics.add_stats(self.outcome.stats, self.outcome.n_tokens)
        elif self.outcome.stats is not None:
            self.metrics.add_stats(self.outcome.stats, 0)
        self._leave()
        if self.end_reason is not None:  # abandoned: no handler is left to record it
            self.record()

    def _leave(self) -> None:
        """Give up the place in line, and the turn if this request holds it (each once)."""
        if not self._left:
            self._left = True
            self.gate.leave()
        if self._running and not self._turn_given_back:
            self._turn_given_back = True
            self.metrics.processing -= 1
            self.gate.give_back_turn()

    # -- endings ----------------------------------------------------------------
    def abandon(self, why: str) -> None:
        """The client left or the deadline passed: cancel in the worker and read to the end in the background."""
        if self.finished or self.end_reason is not None:
            return
        self.end_reason = why
        if not self._running:
            self._leave()
            self.record()
            return
        self.link.cancel(self.id)
        asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        with contextlib.suppress(TimeoutError):
            while not self.finished:
                event = await asyncio.wait_for(self.events.get(), DRAIN_TIMEOUT_S)
                if event is not None:
                    self._note(event)
        if not self.finished:  # the engine never answered the cancel: let the next request try anyway
            self.finished = True
            self._leave()
            self.record()

    def record(self) -> None:
        """Add this request to the log (once)."""
        if self._recorded:
            return
        self._recorded = True
        out, stats = self.outcome, self.outcome.stats
        outcome = self.end_reason or out.finish
        self.metrics.record(RequestRecord(
            when=time.time(), endpoint=self.endpoint, status=self.status, outcome=outcome, stream=self.stream,
            prompt_tokens=stats.prompt_tokens if stats else 0, completion_tokens=out.n_tokens,
            seconds=time.monotonic() - self.t0, decode_tps=stats.decode_tps if stats else None,
            acceptance_rate=stats.acceptance_rate if stats else None,
            speculative=self.speculative.label if self.speculative else "off",
            finish=out.finish if self.finished and self._running else None,
            sequence=stats.sequence if stats and self.metrics.sequences > 1 else None))


# worker error kinds that are the request's fault (400); others are the server's (500)
CLIENT_ERRORS = {"context": "context_length_exceeded", "protocol": "invalid_request", "template": "template_error",
                 "grammar": "invalid_grammar", "image": "invalid_image"}


def engine_error(event: P.ErrorEvent | None) -> ApiError:
    """An engine's error event as the API error it answers (a request's fault is a 400)."""
    if event is None:
        return ApiError(500, "The generation ended with an error.", type_="server_error", code="engine_error")
    if event.kind in ("worker_died", "no_model"):
        return ApiError(503, event.message, type_="server_error", code="worker_died", headers={"Retry-After": "5"})
    if event.kind in CLIENT_ERRORS:
        return ApiError(400, event.message, code=CLIENT_ERRORS[event.kind])
    return ApiError(500, event.message, type_="server_error", code=event.kind)
