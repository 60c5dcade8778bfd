"""Ask a ggml RPC server what it lends, over a plain socket with a timeout.

llama.cpp's own client aborts the whole process when a server is down or
answers wrongly (``GGML_ABORT("Failed to connect …")``), and a slow host can
hold ``connect`` for minutes. This probe speaks the three commands it needs
(HELLO, DEVICE_COUNT, GET_DEVICE_MEMORY) of ggml's RPC protocol itself, so
the Hardware page, ``models fit`` and the worker (before it hands a server to
llama.cpp) get a clear message instead of a dead process or a hang.

A ggml RPC server serves one client at a time: while a loaded model holds
the connection, another probe connects but gets no answer to HELLO. That is
reported as ``busy``, not as dead.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass, field

from engine.rpc.endpoints import Endpoint

# ggml/include/ggml-rpc.h and ggml/src/ggml-rpc/ggml-rpc.cpp of the vendored llama.cpp
PROTO_MAJOR = 7
PROTO_MINOR = 0
_CMD_GET_DEVICE_MEMORY = 11
_CMD_HELLO = 14
_CMD_DEVICE_COUNT = 15
_CONN_CAPS_SIZE = 24  # transport.h RPC_CONN_CAPS_SIZE; all zero: plain TCP, no transport upgrade
DEFAULT_TIMEOUT_S = 3.0


@dataclass(frozen=True)
class RemoteDevice:
    index: int  # the device's number on its server (RPC<index>[host:port] in llama.cpp)
    free: int
    total: int


@dataclass(frozen=True)
class ServerProbe:
    """What one server said, or why it said nothing (``status`` is ``ok``, ``dead``, ``busy``
    or ``incompatible``; ``message`` tells the user what to do when it is not ok)."""

    endpoint: str
    status: str
    message: str = ""
    version: str = ""
    devices: tuple[RemoteDevice, ...] = field(default_factory=tuple)

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks = []
    while n:
        chunk = sock.recv(n)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _call(sock: socket.socket, cmd: int, payload: bytes, reply_size: int) -> bytes:
    """| cmd (1 byte) | size (8 bytes LE) | payload | -> | size (8 bytes LE) | reply |"""
    sock.sendall(struct.pack("<BQ", cmd, len(payload)) + payload)
    (size,) = struct.unpack("<Q", _recv_exact(sock, 8))
    if size != reply_size:
        raise ValueError(f"unexpected reply size {size} to command {cmd} (expected {reply_size})")
    return _recv_exact(sock, size)


def probe(endpoint: Endpoint, timeout_s: float = DEFAULT_TIMEOUT_S) -> ServerProbe:
    """Connect, check the protocol version, list devices with memory; never raises."""
    name = str(endpoint)
    try:
        sock = socket.create_connection((endpoint.host, endpoint.port), timeout=timeout_s)
    except TimeoutError:
        return ServerProbe(name, "dead", f"{name} did not answer within {timeout_s:g} s: check the host is up "
                                         "and its firewall lets the port through")
    except OSError as exc:
        return ServerProbe(name, "dead", f"cannot connect to {name} ({exc.strerror or exc}): start "
                                         "`mtp-studio rpc-server` there, or check the host and port")
    with sock:
        sock.settimeout(timeout_s)
        try:
            hello = _call(sock, _CMD_HELLO, bytes(_CONN_CAPS_SIZE), 4 + _CONN_CAPS_SIZE)
        except TimeoutError:
            return ServerProbe(name, "busy", f"{name} accepted the connection but did not answer within "
                                             f"{timeout_s:g} s; a ggml RPC server serves one client at a time, so "
                                             "another app (or a loaded model) is probably using it")
        except (OSError, ValueError) as exc:
            return ServerProbe(name, "incompatible", f"{name} is not a ggml RPC server of this version ({exc})")
        major, minor, patch = hello[0], hello[1], hello[2]
        version = f"{major}.{minor}.{patch}"
        if major != PROTO_MAJOR or minor > PROTO_MINOR:
            return ServerProbe(name, "incompatible", f"{name} speaks ggml RPC {version}; this engine speaks "
                                                     f"{PROTO_MAJOR}.{PROTO_MINOR}.x. Run the rpc-server built "
                                                     "with this engine (`mtp-studio rpc-server`) there", version)
        try:
            (count,) = struct.unpack("<I", _call(sock, _CMD_DEVICE_COUNT, b"", 4))
            devices = []
            for i in range(count):
                free, total = struct.unpack("<QQ", _call(sock, _CMD_GET_DEVICE_MEMORY, struct.pack("<I", i), 16))
                devices.append(RemoteDevice(i, free, total))
        except (OSError, ValueError) as exc:
            return ServerProbe(name, "dead", f"{name} stopped answering while listing its devices ({exc})", version)
    return ServerProbe(name, "ok", "", version, tuple(devices))


def probe_all(endpoints: tuple[Endpoint, ...], timeout_s: float = DEFAULT_TIMEOUT_S) -> list[ServerProbe]:
    """Probe servers one after another (a handful at most; each is bounded by the timeout)."""
    return [probe(endpoint, timeout_s) for endpoint in endpoints]
