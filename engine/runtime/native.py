"""Loading llama_cpp once, routing its native log, and describing the build.

This package (``engine.runtime``) is the only place that imports ``llama_cpp``.
"""

from __future__ import annotations

import collections
import ctypes
import importlib.metadata
import json
import sys
import threading
from pathlib import Path
from typing import Any

BUILD_RECORD_NAME = "mtp-studio-engine.json"  # written by packaging/build_engine.py

_lock = threading.Lock()
_initialised = False
_log_tail: collections.deque[str] = collections.deque(maxlen=200)
_log_callback: Any = None  # kept alive: llama.cpp holds the pointer
_partial_line: list[str] = []


def llama() -> Any:
    """Import llama_cpp, initialise the backend and install the log router once."""
    global _initialised, _log_callback
    import llama_cpp

    with _lock:
        if not _initialised:
            _log_callback = llama_cpp.llama_log_callback(_on_native_log)
            llama_cpp.llama_log_set(_log_callback, ctypes.c_void_p(0))
            llama_cpp.llama_backend_init()
            _initialised = True
    return llama_cpp


def _on_native_log(level: int, text: bytes, _user: Any) -> None:
    """Keep native log lines (for error messages) and copy them to stderr.

    Never stdout: the worker's protocol owns it.
    """
    try:
        chunk = text.decode("utf-8", errors="replace")
    except Exception:
        return
    _partial_line.append(chunk)
    if chunk.endswith("\n"):
        line = "".join(_partial_line).rstrip("\n")
        _partial_line.clear()
        _log_tail.append(line)
        if level in (3, 4) or _verbose:  # ggml_log_level: 3 = warn, 4 = error
            sys.stderr.write(f"[llama.cpp] {line}\n")


_verbose = False


def set_verbose(value: bool) -> None:
    global _verbose
    _verbose = value


def recent_log(n: int = 8, contains: str | None = None) -> list[str]:
    """The last ``n`` native log lines (optionally only those containing a word)."""
    lines = [line for line in _log_tail if contains is None or contains in line]
    return lines[-n:]


def build_info() -> dict[str, Any]:
    """Which engine build this is: version, backend, and the build record if any."""
    try:
        version = importlib.metadata.version("llama_cpp_python")
    except importlib.metadata.PackageNotFoundError:
        version = "not installed"
    info: dict[str, Any] = {"llama_cpp_python": version, "backend": "unknown"}
    record = Path(sys.prefix) / BUILD_RECORD_NAME
    try:
        data = json.loads(record.read_text())
        info.update({k: data[k] for k in ("backend", "patch_hash", "cmake_args", "cache_key") if k in data})
    except (OSError, ValueError):
        info["backend"] = "unknown (not installed by packaging/build_engine.py)"
    return info
