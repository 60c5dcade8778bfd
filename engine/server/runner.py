"""Runs the ASGI app on uvicorn: in the foreground (``mtp-studio serve``) or
on a thread with its own asyncio loop (the app's panel, tests, the benchmark).

The listening socket is bound here, before uvicorn starts, so a port in use
is an ``OSError`` the caller can show, and port 0 gets a free port that
:attr:`ServerThread.port` reports.
"""

from __future__ import annotations

import socket
import threading
import time

import uvicorn

from engine.server.app import create_app
from engine.server.config import KEEP_ALIVE_S, ServerConfig, check
from engine.server.deadlines import Deadlines, protocol_for
from engine.server.engine_link import EngineLink
from engine.server.metrics import Metrics

START_TIMEOUT_S = 15.0


def bind(host: str, port: int) -> socket.socket:
    """A listening socket. Raises ``OSError`` (the port is taken, the address is not this machine's)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def _uvicorn(link: EngineLink, config: ServerConfig, metrics: Metrics) -> uvicorn.Server:
    app = create_app(link, config, metrics)
    deadlines = Deadlines(config.header_timeout_s, config.body_timeout_s, config.max_connections,
                          config.retry_after_s)
    # access_log off: our request log never holds headers (the key) or prompts
    return uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                                         timeout_graceful_shutdown=3, timeout_keep_alive=KEEP_ALIVE_S,
                                         http=protocol_for(deadlines)))


class ServerThread:
    """The server on a background thread. ``start`` returns once it accepts connections."""

    def __init__(self, link: EngineLink, config: ServerConfig, metrics: Metrics | None = None) -> None:
        check(config)
        self.config = config
        self.metrics = metrics or Metrics()
        self._sock = bind(config.host, config.port)
        self.port: int = self._sock.getsockname()[1]
        self._server = _uvicorn(link, config, self.metrics)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]},
                                        name="local-server", daemon=True)

    @property
    def base_url(self) -> str:
        host = f"[{self.config.host}]" if ":" in self.config.host else self.config.host
        return f"http://{host}:{self.port}/v1"

    def start(self) -> ServerThread:
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("The local server did not start; see the log for why.")
            time.sleep(0.02)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._server.should_exit = True
        self._thread.join(timeout)
        self._sock.close()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()


def serve_forever(link: EngineLink, config: ServerConfig, sock: socket.socket, metrics: Metrics | None = None) -> None:
    """Serve on ``sock`` (from :func:`bind`) in this thread until Ctrl+C (uvicorn handles the signals)."""
    check(config)
    try:
        _uvicorn(link, config, metrics or Metrics()).run(sockets=[sock])
    finally:
        sock.close()
