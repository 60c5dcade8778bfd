"""Remote ggml devices as llama.cpp devices: the native half of ``engine/rpc``.

Replicates what llama.cpp's ``--rpc`` does (common/arg.cpp
``add_rpc_devices``): find the ``RPC`` backend in ggml's registry, call its
``ggml_backend_rpc_add_server`` (found with
``ggml_backend_reg_get_proc_address``) once per ``host:port``, and take that
server's devices. Unlike ``--rpc`` the servers are *not* registered
globally: the devices are handed to each model explicitly
(``llama_model_params.devices``), so a model loaded without them — an MTP
sidecar, say — stays on this machine.

ggml's client aborts the process when a server is down, so every server is
probed first over a plain socket (``engine/rpc/probe.py``) and refused with
a clear message; one that dies later ends the worker, which the app restarts.

ggml is reached through the ``libggml`` that sits next to the ``libllama``
llama_cpp loaded (``LLAMA_CPP_LIB_PATH`` or the package's ``lib``): libllama
finds its libggml through its own RUNPATH, and opening the same file again
returns the already-loaded library, never a second copy.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.errors import RpcError
from engine.rpc.endpoints import Endpoint
from engine.rpc.probe import (
    DEFAULT_TIMEOUT_S,
    REPLY_TIMEOUT_S,
    bound_client_connections,
    client_connection_alive,
    probe,
)
from engine.runtime import native

DEV_CPU, DEV_GPU, DEV_IGPU = 0, 1, 2  # enum ggml_backend_dev_type
_lock = threading.Lock()
_ggml: Any = None
_servers: dict[str, list[Device]] = {}  # ggml registers each endpoint once per process
_anchors: dict[str, int] = {}  # endpoint -> a ggml backend that keeps its connection open (see _anchor)


@dataclass(frozen=True)
class Device:
    """A ggml device (``handle`` is its ``ggml_backend_dev_t``)."""

    handle: int
    name: str
    description: str
    free: int
    total: int
    remote: bool


def _lib_path() -> Path:
    import llama_cpp.llama_cpp as lc

    base = Path(lc._base_path)
    for name in ("libggml.so", "libggml.dylib", "ggml.dll"):
        if (base / name).exists():
            return base / name
    raise RpcError(f"no libggml next to libllama in {base}; the engine build is incomplete")


def ggml() -> Any:
    """The ggml library libllama uses, with the device functions typed."""
    global _ggml
    native.llama()  # libllama (and through it libggml) first
    with _lock:
        if _ggml is None:
            lib = ctypes.CDLL(str(_lib_path()), mode=getattr(ctypes, "RTLD_GLOBAL", 0))
            vp, sz, cp = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p
            for name, args, res in (
                ("ggml_backend_reg_by_name", [cp], vp),
                ("ggml_backend_reg_get_proc_address", [vp, cp], vp),
                ("ggml_backend_reg_dev_count", [vp], sz),
                ("ggml_backend_reg_dev_get", [vp, sz], vp),
                ("ggml_backend_reg_name", [vp], cp),
                ("ggml_backend_dev_count", [], sz),
                ("ggml_backend_dev_get", [sz], vp),
                ("ggml_backend_dev_by_type", [ctypes.c_int], vp),
                ("ggml_backend_dev_name", [vp], cp),
                ("ggml_backend_dev_description", [vp], cp),
                ("ggml_backend_dev_type", [vp], ctypes.c_int),
                ("ggml_backend_dev_backend_reg", [vp], vp),
                ("ggml_backend_dev_memory", [vp, ctypes.POINTER(sz), ctypes.POINTER(sz)], None),
                ("ggml_set_abort_callback", [vp], vp),
                ("ggml_backend_dev_init", [vp, cp], vp),
                ("ggml_backend_free", [vp], None),
            ):
                fn = getattr(lib, name)
                fn.argtypes, fn.restype = args, res
            _ggml = lib
    return _ggml


def _device(handle: int, remote: bool) -> Device:
    lib = ggml()
    free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
    lib.ggml_backend_dev_memory(handle, ctypes.byref(free), ctypes.byref(total))
    return Device(handle, (lib.ggml_backend_dev_name(handle) or b"").decode(),
                  (lib.ggml_backend_dev_description(handle) or b"").decode(), free.value, total.value, remote)


def supported() -> bool:
    """Was this engine built with ggml's RPC backend (``GGML_RPC=ON``)?"""
    return bool(native.llama().llama_supports_rpc())


def connect(endpoints: tuple[Endpoint, ...], timeout_s: float = DEFAULT_TIMEOUT_S) -> list[Device]:
    """The devices of these servers, in order, connecting to each once per process.

    Raises:
        RpcError: the engine has no RPC backend, or a server is dead, busy or
            speaks another protocol version (probed before ggml connects, since
            ggml's own client would abort the process).
    """
    if not endpoints:
        return []
    if not supported():
        raise RpcError("this engine was built without ggml's RPC backend; rebuild it with "
                       "`python packaging/build_engine.py` (every build now has -DGGML_RPC=ON)")
    lib = ggml()
    reg = lib.ggml_backend_reg_by_name(b"RPC")
    add = lib.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_rpc_add_server") if reg else None
    if not add:
        raise RpcError("ggml's RPC backend is not registered in this engine build")
    add_server = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)(add)
    devices: list[Device] = []
    for endpoint in endpoints:
        key = str(endpoint)
        if key in _anchors:
            if client_connection_alive(endpoint):  # ours: the server is there, busy with this process
                devices += [_device(d.handle, True) for d in _servers[key]]
                continue
            lib.ggml_backend_free(_anchors.pop(key))  # it died or restarted: drop the dead connection
        found = probe(endpoint, timeout_s)  # every load: a server that died since is refused, not aborted on
        # busy: one client at a time, and this process may hold the connection (a model still loaded)
        if not found.ok and not (found.status == "busy" and key in _servers):
            raise RpcError(found.message)
        if key not in _servers:
            if not found.devices:
                raise RpcError(f"{key} lends no devices; start its rpc-server with at least one")
            # ggml parses host:port itself; IPv6 hosts go without brackets there
            server = add_server(f"{endpoint.host}:{endpoint.port}".encode())
            if not server:
                raise RpcError(f"ggml could not add the RPC server {key}")
            n = lib.ggml_backend_reg_dev_count(server)
            _servers[key] = [_device(lib.ggml_backend_reg_dev_get(server, i), True) for i in range(n)]
            bound = _anchor(key, endpoint)
            print(f"rpc: connected to {key}: {n} device(s)"
                  + ("" if bound else " (no socket timeouts: its connection was not found)"), file=sys.stderr)
        elif key not in _anchors:
            _anchor(key, endpoint)
        devices += [_device(d.handle, True) for d in _servers[key]]  # fresh memory figures
    return devices


def _anchor(key: str, endpoint: Endpoint) -> int:
    """Hold one ggml connection to ``endpoint`` open for the process and bound it; return how many
    sockets got keepalive and timeouts (see ``bound_client_connections``).

    ggml keeps a server's connection only while something holds it (a backend or a buffer) and opens
    a new one on the next call otherwise, so options set on one connection would be lost with it. A
    backend of the server's first device, kept here, pins the one connection every model and context
    then shares (llama.cpp's ``get_dispatcher``), and that connection gets the options.
    """
    lib = ggml()
    backend = lib.ggml_backend_dev_init(_servers[key][0].handle, None)
    if not backend:
        return 0
    _anchors[key] = backend
    return bound_client_connections(endpoint, reply_timeout_s())


def reply_timeout_s() -> float:
    """How long a remote reply may take (``MTP_STUDIO_RPC_REPLY_TIMEOUT_S``, default ``REPLY_TIMEOUT_S``)."""
    try:
        value = float(os.environ.get("MTP_STUDIO_RPC_REPLY_TIMEOUT_S", REPLY_TIMEOUT_S))
    except ValueError:
        return REPLY_TIMEOUT_S
    return value if 0 < value < 1e6 else REPLY_TIMEOUT_S


def local_devices() -> list[Device]:
    """What this machine computes with: its GPUs (integrated ones only when there is no
    discrete GPU, as llama.cpp chooses), else its CPU."""
    lib = ggml()
    gpus, igpus, cpu = [], [], None
    for i in range(lib.ggml_backend_dev_count()):
        handle = lib.ggml_backend_dev_get(i)
        kind = lib.ggml_backend_dev_type(handle)
        if kind == DEV_GPU and lib.ggml_backend_reg_name(lib.ggml_backend_dev_backend_reg(handle)) != b"RPC":
            gpus.append(handle)
        elif kind == DEV_IGPU:
            igpus.append(handle)
        elif kind == DEV_CPU and cpu is None:
            cpu = handle
    chosen = gpus or igpus or ([cpu] if cpu else [])
    return [_device(h, False) for h in chosen]


_ABORT_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_char_p)
_abort_handler: Any = None  # kept alive: ggml holds the pointer


def on_abort(handler: Any) -> None:
    """Call ``handler(message)`` when ggml is about to abort the process (``GGML_ABORT``).

    ggml's RPC client aborts when a server dies mid-reply; this is the one
    moment the worker can still say so on the protocol before the process
    ends. The abort happens anyway when the handler returns.
    """
    global _abort_handler

    def call(message: bytes | None) -> None:
        try:
            handler((message or b"").decode("utf-8", errors="replace"))
        except BaseException:  # never raise into C
            pass

    _abort_handler = _ABORT_CALLBACK(call)
    ggml().ggml_set_abort_callback(ctypes.cast(_abort_handler, ctypes.c_void_p))


def device_array(devices: list[Device]) -> Any:
    """A NULL-terminated ``ggml_backend_dev_t[]`` for ``llama_model_params.devices``."""
    arr = (ctypes.c_void_p * (len(devices) + 1))(*[d.handle for d in devices], None)
    return arr
