"""The server's settings and the rules they must follow before it binds.

Loopback is the default. Any other address is reachable by other machines,
so it needs an API key; :func:`check` refuses the combination otherwise.
The key itself is kept in the OS keyring (``engine/server/api_key.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.load_options import MAX_PARALLEL
from engine.netaddr import is_loopback

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8181  # llama-server takes 8080, LM Studio 1234, Ollama 11434: keep clear of them
DEFAULT_QUEUE = 8  # requests waiting behind the running one; beyond it, 503
DEFAULT_BODY_LIMIT = 8 << 20  # bytes; a longer prompt than this does not fit any context we load
DEFAULT_QUEUE_TIMEOUT_S = 300.0
DEFAULT_REQUEST_TIMEOUT_S = 600.0
RETRY_AFTER_S = 2
DEFAULT_HEADER_TIMEOUT_S = 10.0  # a whole request head; a real client sends it in one packet
DEFAULT_BODY_TIMEOUT_S = 60.0  # the whole body after the head: 8 MB at well under 1 Mbit/s
DEFAULT_MAX_CONNECTIONS = 256  # open at once; far below the usual 1,024 file descriptors
KEEP_ALIVE_S = 5.0  # an idle connection after a response (uvicorn's timeout_keep_alive)


class ConfigError(ValueError):
    """Settings the server refuses to start with; the text says what to change."""


@dataclass(frozen=True)
class ServerConfig:
    """How the server listens and what it accepts.

    Attributes:
        host / port: where it binds (port 0: any free port; the runner reports it).
        api_key: required as ``Authorization: Bearer <key>`` when set; None: no key.
        model_id: the name ``/v1/models`` lists and requests use (default: the file's name).
        cors_origins: browser origins allowed to call the API; empty: CORS off.
        parallel: generations that run at once (the worker loads the model with as many sequences and
            decodes them together); 1: one at a time.
        max_queue: requests that may wait behind the running ones; more get 503 + Retry-After.
        queue_timeout_s: how long a request may wait for its turn before a 503.
        request_timeout_s: how long one generation may run before it is cancelled (504).
        max_body_bytes: a larger request body gets 413.
        header_timeout_s / body_timeout_s: a request head / body slower than this gets 408 and is closed.
        max_connections: connections open at once; a further one gets 503 at once (engine/server/deadlines.py).
        strict_model: refuse a request naming another model (400); by default any name, or none, is served
            by the loaded model, as llama-server does, since clients send what their user typed or a default.
        chat_template: a chat template (Jinja text) for every chat request in place of the model's
            (``serve --chat-template``); None: the model's own.
        local_images: an ``image_url`` part may name a file on this machine (a path or ``file://``),
            which the server reads; off by default, since whoever can call the API could read any
            image the server's user can (``serve --allow-local-images``).
    """

    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    api_key: str | None = None
    model_id: str | None = None
    cors_origins: tuple[str, ...] = field(default_factory=tuple)
    parallel: int = 1
    max_queue: int = DEFAULT_QUEUE
    queue_timeout_s: float = DEFAULT_QUEUE_TIMEOUT_S
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S
    max_body_bytes: int = DEFAULT_BODY_LIMIT
    retry_after_s: int = RETRY_AFTER_S
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    strict_model: bool = False
    chat_template: str | None = None
    local_images: bool = False

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1"


def check(config: ServerConfig) -> None:
    """Refuse settings that would expose the engine or cannot work.

    Raises:
        ConfigError: a non-loopback address without an API key, a bad port,
            queue or limit, or a CORS origin that is not an origin.
    """
    if not is_loopback(config.host) and not config.api_key:
        raise ConfigError(f"Binding {config.host} makes the server reachable from other machines; "
                          "set an API key (--api-key, or the panel's key) or bind 127.0.0.1.")
    if not 0 <= config.port <= 65535:
        raise ConfigError(f"The port must be from 0 to 65535, not {config.port}.")
    if config.api_key is not None and (len(config.api_key) < 8 or not config.api_key.isprintable()
                                       or " " in config.api_key):
        raise ConfigError("The API key must be at least 8 printable characters without spaces.")
    if not 1 <= config.parallel <= MAX_PARALLEL:
        raise ConfigError(f"--parallel must be from 1 to {MAX_PARALLEL}, not {config.parallel}.")
    if config.max_queue < 0:
        raise ConfigError(f"The queue size must be 0 or more, not {config.max_queue}.")
    if config.max_connections < 1:
        raise ConfigError(f"The connection limit must be 1 or more, not {config.max_connections}.")
    for name in ("queue_timeout_s", "request_timeout_s", "header_timeout_s", "body_timeout_s"):
        if getattr(config, name) <= 0:
            raise ConfigError(f"{name} must be positive, not {getattr(config, name)}.")
    if config.max_body_bytes < 1024:
        raise ConfigError(f"The body size limit must be at least 1024 bytes, not {config.max_body_bytes}.")
    if "*" in config.cors_origins and not config.api_key:
        raise ConfigError("CORS origin '*' lets every web page you open use the model; name the origins "
                          "(http://localhost:3000) or set an API key.")
    for origin in config.cors_origins:
        if origin != "*" and not origin.startswith(("http://", "https://")):
            raise ConfigError(f"A CORS origin looks like http://localhost:3000, not {origin!r}.")
