"""Deadlines and a connection limit for every connection the server accepts.

uvicorn alone holds a connection for ever while it sends nothing, a header a
byte every two seconds, or a chunked body that never ends (its keep-alive
timer starts only after a first response, and any byte restarts it); enough
of them use up the process's file descriptors, and then every ``accept``
fails and is logged with a traceback. So each connection here must send a
whole request head within ``header_timeout_s`` of connecting (or of its
previous response) and the whole body within ``body_timeout_s`` of the head;
otherwise it gets a 408 and is closed. Beyond ``max_connections`` open at
once, a new connection is answered 503 at once, before it sends anything,
and closed; the first refusal of a burst is logged, and the count when the
burst is over — never a line per connection.

uvicorn's own ``limit_concurrency`` is not used: it waits for the request
head (which a silent connection never sends), answers in plain text and
logs every refusal.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Any

from engine.server.http_errors import JsonErrorsHTTPProtocol

log = logging.getLogger("engine.server")


@dataclass(frozen=True)
class Deadlines:
    header_timeout_s: float
    body_timeout_s: float
    max_connections: int
    retry_after_s: int


def _response(status: str, code: str, message: str, extra: bytes = b"") -> bytes:
    body = json.dumps({"error": {"message": message, "type": "server_error" if status.startswith("503")
                                 else "invalid_request_error", "param": None, "code": code}}).encode("ascii")
    return (b"HTTP/1.1 %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n%sconnection: close\r\n\r\n"
            % (status.encode("ascii"), len(body), extra) + body)


@dataclass
class RefusalLog:
    """Counts the connections refused in one burst: one line when it starts, one when it ends."""

    limit: int
    refused: int = 0

    def refuse(self) -> None:
        if self.refused == 0:
            log.warning("More than %d connections are open at once; new ones get 503 until some close.",
                        self.limit)
        self.refused += 1

    def closed(self, open_now: int) -> None:
        if self.refused and open_now < self.limit:
            log.warning("The burst is over: %d connection(s) were refused with 503.", self.refused)
            self.refused = 0


class DeadlineProtocol(JsonErrorsHTTPProtocol):  # type: ignore[misc]
    """The JSON-error HTTP protocol with a head deadline, a body deadline and the connection limit.

    Subclassed per server by :func:`protocol_for`, which sets the two class attributes.
    """

    deadlines: Deadlines
    refusals: RefusalLog

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._timer: asyncio.TimerHandle | None = None
        self._cycle_seen: Any = None
        self._refused = len(self.connections) > self.deadlines.max_connections
        if self._refused:
            self.refusals.refuse()
            retry = b"retry-after: %d\r\n" % self.deadlines.retry_after_s
            transport.write(_response("503 Service Unavailable", "too_many_connections",
                                      "The server has too many open connections; retry shortly.", retry))
            transport.close()
            return
        self._arm(self.deadlines.header_timeout_s, "header")

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)
        if not self._refused:
            self.refusals.closed(len(self.connections))

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        super().data_received(data)
        cycle = self.cycle
        if cycle is not None and cycle is not self._cycle_seen:  # a new request head was read whole
            self._cycle_seen = cycle
            self._disarm()
            if cycle.more_body:
                self._arm(self.deadlines.body_timeout_s, "body")
        if cycle is not None and not cycle.more_body and self._timer is not None and self._what == "body":
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():  # keep-alive: the next request head has its own deadline
            self._arm(self.deadlines.header_timeout_s, "header")

    def _arm(self, seconds: float, what: str) -> None:
        self._disarm()
        self._what = what
        self._timer = self.loop.call_later(seconds, self._timed_out)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _timed_out(self) -> None:
        self._timer = None
        if self.transport.is_closing():
            return
        cycle = self.cycle
        if cycle is None or not cycle.response_started:
            limit = self.deadlines.header_timeout_s if self._what == "header" else self.deadlines.body_timeout_s
            self.transport.write(_response("408 Request Timeout", "request_timeout",
                                           f"The request {self._what} did not arrive within {limit:g} s."))
        self.transport.close()


def protocol_for(deadlines: Deadlines) -> type[DeadlineProtocol]:
    """The protocol class for one server: its limits, and a refusal count of its own."""
    return type("ServerProtocol", (DeadlineProtocol,),
                {"deadlines": deadlines, "refusals": RefusalLog(deadlines.max_connections)})
