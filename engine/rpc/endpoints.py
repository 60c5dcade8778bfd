"""``host:port`` lists as llama.cpp's ``--rpc`` takes them, checked before anything connects."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from engine.errors import RpcError

DEFAULT_PORT = 50052  # ggml's rpc-server default
MAX_SERVERS = 16  # GGML_RPC_MAX_SERVERS


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_endpoint(text: str) -> Endpoint:
    """``host:port`` (IPv6 as ``[::1]:port``). The port is required: a server on
    the wrong port would be a silent mistake."""
    text = text.strip()
    host, sep, port = text.rpartition(":")
    if text.startswith("["):
        host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise RpcError(f"RPC server {text!r} is not host:port (for example 192.168.1.20:{DEFAULT_PORT})")
    return Endpoint(host, int(port))


def parse_endpoints(value: str | Iterable[str]) -> tuple[Endpoint, ...]:
    """A comma-separated string or a list of ``host:port``; duplicates and more than
    ggml's 16 servers are refused (one connection per server per process)."""
    items = value.split(",") if isinstance(value, str) else list(value)
    endpoints = tuple(parse_endpoint(item) for item in items if item.strip())
    if len(set(endpoints)) != len(endpoints):
        raise RpcError("an RPC server is named twice; name each host:port once")
    if len(endpoints) > MAX_SERVERS:
        raise RpcError(f"ggml RPC takes at most {MAX_SERVERS} servers, got {len(endpoints)}")
    return endpoints
