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

import os
import select
import socket
import stat
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from engine.rpc.endpoints import Endpoint

# ggml/include/ggml-rpc.h and ggml/src/ggml-rpc/ggml-rpc.cpp of the vendored llama.cpp
PROTO_MAJOR = 7
PROTO_MINOR = 0
_CMD_GET_DEVICE_MEMORY = 11
_CMD_HELLO = 14
_CMD_DEVICE_COUNT = 15
_CONN_CAPS_SIZE = 24  # transport.h RPC_CONN_CAPS_SIZE; all zero: plain TCP, no transport upgrade
DEFAULT_TIMEOUT_S = 3.0  # the whole probe, connecting included
# Devices one server may announce. ggml lends one per backend device of the machine (a few GPUs and the
# CPU); a count past this is a broken or hostile server, and asking each one's memory would take for ever.
MAX_DEVICES = 256


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


class _Deadline:
    """One clock for the whole probe. A socket timeout bounds each read, so a server that
    trickles its answer a byte at a time, or announces 2^32-1 devices, could otherwise hold
    the probe for ever while every single read is quick."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.end = time.monotonic() + seconds
        self.received = 0  # bytes of answer so far: none at all means the server is busy with another client

    def arm(self, sock: socket.socket) -> None:
        left = self.end - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"no complete answer within {self.seconds:g} s")
        sock.settimeout(left)


def _recv_exact(sock: socket.socket, n: int, deadline: _Deadline) -> bytes:
    chunks = []
    while n:
        deadline.arm(sock)
        chunk = sock.recv(n)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        deadline.received += len(chunk)
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _call(sock: socket.socket, cmd: int, payload: bytes, reply_size: int, deadline: _Deadline) -> bytes:
    """| cmd (1 byte) | size (8 bytes LE) | payload | -> | size (8 bytes LE) | reply |"""
    deadline.arm(sock)
    sock.sendall(struct.pack("<BQ", cmd, len(payload)) + payload)
    (size,) = struct.unpack("<Q", _recv_exact(sock, 8, deadline))
    if size != reply_size:
        raise ValueError(f"unexpected reply size {size} to command {cmd} (expected {reply_size})")
    return _recv_exact(sock, size, deadline)


def probe(endpoint: Endpoint, timeout_s: float = DEFAULT_TIMEOUT_S) -> ServerProbe:
    """Connect, check the protocol version, list devices with memory; never raises.

    ``timeout_s`` bounds the whole probe (connecting included), not each read.
    """
    name = str(endpoint)
    deadline = _Deadline(timeout_s)
    try:
        sock = socket.create_connection((endpoint.host, endpoint.port), timeout=timeout_s)
    except TimeoutError:
        return ServerProbe(name, "dead", f"{name} did not answer within {timeout_s:g} s: check the host is up "
                                         "and its firewall lets the port through")
    except OSError as exc:
        return ServerProbe(name, "dead", f"cannot connect to {name} ({exc.strerror or exc}): start "
                                         "`mtp-studio rpc-server` there, or check the host and port")
    with sock:
        try:
            hello = _call(sock, _CMD_HELLO, bytes(_CONN_CAPS_SIZE), 4 + _CONN_CAPS_SIZE, deadline)
        except TimeoutError:
            if deadline.received:
                return ServerProbe(name, "incompatible", f"{name} sent only {deadline.received} byte(s) of its "
                                                         f"greeting in {timeout_s:g} s; a ggml RPC server answers "
                                                         "at once, so this is something else on that port or a "
                                                         "host too slow to use")
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
            (count,) = struct.unpack("<I", _call(sock, _CMD_DEVICE_COUNT, b"", 4, deadline))
            if count > MAX_DEVICES:
                return ServerProbe(name, "incompatible", f"{name} claims {count:,} devices; a ggml RPC server "
                                                         f"lends at most {MAX_DEVICES}, so this one is broken or "
                                                         "not a ggml RPC server. Restart `mtp-studio rpc-server` "
                                                         "there", version)
            devices = []
            for i in range(count):
                memory = _call(sock, _CMD_GET_DEVICE_MEMORY, struct.pack("<I", i), 16, deadline)
                free, total = struct.unpack("<QQ", memory)
                devices.append(RemoteDevice(i, free, total))
        except TimeoutError:
            return ServerProbe(name, "dead", f"{name} did not finish listing its devices within {timeout_s:g} s",
                               version)
        except (OSError, ValueError) as exc:
            return ServerProbe(name, "dead", f"{name} stopped answering while listing its devices ({exc})", version)
    return ServerProbe(name, "ok", "", version, tuple(devices))


def probe_all(endpoints: tuple[Endpoint, ...], timeout_s: float = DEFAULT_TIMEOUT_S) -> list[ServerProbe]:
    """Probe servers one after another (16 at most; each is bounded by the timeout as a whole)."""
    return [probe(endpoint, timeout_s) for endpoint in endpoints]


# After the probe, llama.cpp's own client holds a blocking socket with no timeout: a host that dies or
# freezes mid-reply, or a server process that stops (SIGSTOP), would stop the reply for ever. ggml gives no
# way to pass options (transport.cpp sets only TCP_NODELAY), but its socket is an ordinary descriptor of
# this process, so the options are set on it from outside: any failed read then makes ggml abort, which the
# worker turns into an `rpc` error (engine/worker/server.py) — no C++ patch needed.
KEEPALIVE_IDLE_S = 10  # an idle connection is probed after this long
KEEPALIVE_INTERVAL_S = 5
KEEPALIVE_PROBES = 3  # a dead host: the connection fails about 25 s after it last answered
UNACKED_TIMEOUT_S = 30  # Linux TCP_USER_TIMEOUT: data sent and not acknowledged (a frozen or unplugged host)
# A reply that does not come while the host still acknowledges (the server process stopped, or wedged):
# generous, since one remote compute of a long prompt's batch on a slow CPU can take a minute or more.
REPLY_TIMEOUT_S = 300


def bound_client_connections(endpoint: Endpoint, reply_timeout_s: float = REPLY_TIMEOUT_S) -> int:
    """Give this process's TCP connections to ``endpoint`` keepalive and send/receive timeouts.

    Meant for the connection ggml's RPC client opened (``ggml_backend_rpc_add_server``); the probe's
    own socket is closed by then. Finds the connections by their peer address among this process's
    descriptors (``/proc/self/fd`` or ``/dev/fd``) and sets the options on a duplicate, which shares
    the socket.

    Returns:
        How many connections were found and set (0 where descriptors cannot be listed, e.g. Windows).
    """
    done = 0
    for sock in _client_sockets(endpoint):
        try:
            _set_bounds(sock, reply_timeout_s)
            done += 1
        except OSError:
            continue
    return done


def _client_sockets(endpoint: Endpoint) -> Iterator[socket.socket]:
    """This process's IPv4 TCP connections to ``endpoint``, as duplicates (each closed after its turn).

    The peer is resolved as ggml resolves it (IPv4, ``gethostbyname``); a descriptor that is not
    such a socket, or cannot be asked, is passed over.
    """
    try:
        peer_ip = socket.gethostbyname(endpoint.host)
    except OSError:
        return
    for fd in _open_descriptors():
        try:
            if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                continue
            sock = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        with sock:
            try:
                ours = (sock.type == socket.SOCK_STREAM and sock.family == socket.AF_INET
                        and sock.getpeername() == (peer_ip, endpoint.port))
            except OSError:
                continue
            if ours:
                yield sock


def _open_descriptors() -> list[int]:
    for folder in ("/proc/self/fd", "/dev/fd"):
        try:
            return sorted(int(name) for name in os.listdir(folder) if name.isdigit())
        except OSError:
            continue
    return []


def _set_bounds(sock: socket.socket, reply_timeout_s: float) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in (("TCP_KEEPIDLE", KEEPALIVE_IDLE_S), ("TCP_KEEPALIVE", KEEPALIVE_IDLE_S),  # macOS name
                          ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL_S), ("TCP_KEEPCNT", KEEPALIVE_PROBES),
                          ("TCP_USER_TIMEOUT", UNACKED_TIMEOUT_S * 1000)):
        if hasattr(socket, option):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)
    seconds = int(reply_timeout_s)
    timeval = struct.pack("ll", seconds, int((reply_timeout_s - seconds) * 1e6))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeval)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeval)


def sever_client_connections(endpoint: Endpoint) -> int:
    """Shut this process's TCP connections to ``endpoint`` down, both ways, under whoever holds them.

    A thread blocked reading or writing one (ggml's client, waiting on a server that stopped
    answering) wakes with end-of-file or ``EPIPE``: the one way to end a wait inside C from Python.
    ggml then aborts the process, as for any failed read (``engine/worker/rpc_stop.py``).

    Returns:
        How many connections were shut down.
    """
    done = 0
    for sock in _client_sockets(endpoint):
        try:
            sock.shutdown(socket.SHUT_RDWR)
            done += 1
        except OSError:
            continue
    return done


def client_connection_alive(endpoint: Endpoint) -> bool:
    """Is this process's connection to ``endpoint`` (ggml's, kept open) still open at the other end?

    A ggml RPC server serves one client at a time, so while that connection is held a probe would only
    see a busy server; this asks the socket instead (a peer that closed makes it readable with no data).
    """
    for sock in _client_sockets(endpoint):
        try:
            readable, _, _ = select.select([sock], [], [], 0)
            if not readable:
                return True
            return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
        except BlockingIOError:
            return True
        except OSError:
            return False
    return False
