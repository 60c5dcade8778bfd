"""Stop's deadline for a reply waiting on a remote RPC server.

Stop marks a reply cancelled, and the decode loop looks between steps. A
decode inside ggml's RPC client, waiting for a server that stopped answering
(its process stopped or wedged, its host frozen), never gets there, and
Python cannot interrupt a C call: the reply would end only at the
connection's own timeouts (``engine/rpc/probe.py``, up to 300 s). So when a
stopped reply on a model split across RPC servers has not ended
:func:`stop_deadline_s` after Stop, the worker shuts its connections to
those servers down: ggml's blocked read returns, ggml aborts, and the
worker's abort callback ends the reply (an ``rpc`` error saying what
happened, then ``done`` with ``finish_reason`` cancelled) before the process
ends; the app restarts it. Should even that not end the reply within
:data:`EXIT_AFTER_SEVER_S`, the worker ends the reply itself and exits.

Stopping without losing the worker and its loaded model would need a change
in ggml's RPC client (a wait that can be cancelled); this needs none.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

from engine.rpc.endpoints import parse_endpoints
from engine.rpc.probe import sever_client_connections

STOP_DEADLINE_S = 10.0  # after Stop, how long a reply may go on waiting on a remote server
EXIT_AFTER_SEVER_S = 5.0  # after the connections are shut, how long ggml has to abort before the worker exits


def stop_deadline_s() -> float:
    """Stop's deadline (``MTP_STUDIO_RPC_STOP_DEADLINE_S``, default :data:`STOP_DEADLINE_S`)."""
    try:
        value = float(os.environ.get("MTP_STUDIO_RPC_STOP_DEADLINE_S", STOP_DEADLINE_S))
    except ValueError:
        return STOP_DEADLINE_S
    return value if 0 < value < 1e6 else STOP_DEADLINE_S


def stopped_message(servers: tuple[str, ...], deadline_s: float) -> str:
    """What the user is told when Stop had to cut the connections to end the reply."""
    return (f"Stop could not end the reply at once: it was waiting on the remote RPC server(s) "
            f"{', '.join(servers)}, which gave no answer within {deadline_s:g} s of Stop. The engine closed its "
            "connections to them, which ends the engine: restart it (and check each server with "
            "`mtp-studio rpc-probe HOST:PORT`). The reply so far and the conversation are kept.")


class RpcStop:
    """Cuts a stopped reply's wait on its RPC servers once the deadline passes.

    Args:
        running: the id of the reply running now (None between replies).
        end_reply: ends a reply with an ``rpc`` error (the text given) and ``done`` (cancelled); the
            caller sends that once, whether ggml's abort or this deadline gets there first.
        log: a diagnostic line (never raises).
    """

    def __init__(self, running: Callable[[], str | None], end_reply: Callable[[str, str], None],
                 log: Callable[[str], None]) -> None:
        self._running, self._end_reply, self._log = running, end_reply, log
        self._lock = threading.Lock()
        self._armed: set[str] = set()
        self.severed: str | None = None  # the reply whose servers were cut: its end is Stop's, not a failure
        self.message = ""

    def arm(self, request_id: str, servers: tuple[str, ...]) -> None:
        """Stop reached ``request_id``, which runs on ``servers``: start the deadline (once per reply)."""
        if not servers:
            return
        with self._lock:
            if request_id in self._armed:
                return
            self._armed.add(request_id)
        deadline = stop_deadline_s()
        self._after(deadline, lambda: self._sever(request_id, servers, deadline))

    def _sever(self, request_id: str, servers: tuple[str, ...], deadline_s: float) -> None:
        with self._lock:
            self._armed.discard(request_id)
        if self._running() != request_id:  # the reply ended by itself, as nearly every stopped reply does
            return
        self.message = stopped_message(servers, deadline_s)
        self.severed = request_id
        cut = sum(sever_client_connections(endpoint) for endpoint in parse_endpoints(servers))
        self._log(f"worker: a stopped reply still waited on {', '.join(servers)} after {deadline_s:g} s; "
                  f"shut {cut} connection(s) down")
        self._after(EXIT_AFTER_SEVER_S, lambda: self._exit(request_id))

    def _exit(self, request_id: str) -> None:
        if self._running() != request_id:
            return
        self._end_reply(request_id, self.message)
        self._log("worker: ggml did not give the reply back after its connections were shut; exiting")
        os._exit(1)

    @staticmethod
    def _after(seconds: float, action: Callable[[], None]) -> None:
        timer = threading.Timer(seconds, action)
        timer.daemon = True
        timer.start()
