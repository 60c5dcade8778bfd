"""Loading llama_cpp once, routing its native log, and describing the build.

This package (``engine.runtime``) is the only place that imports ``llama_cpp``.
"""

from __future__ import annotations

import collections
import ctypes
import importlib.metadata
import json
import os
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
            expose_software_devices()
            _log_callback = llama_cpp.llama_log_callback(_on_native_log)
            llama_cpp.llama_log_set(_log_callback, ctypes.c_void_p(0))
            _load_backend_libraries(llama_cpp)
            llama_cpp.llama_backend_init()
            _initialised = True
    return llama_cpp


SOFTWARE_GPU_ENV = "MTP_STUDIO_SOFTWARE_GPU"


def software_gpu_requested() -> bool:
    """Whether the user (or a test) asked to count a software renderer as a device.

    Mesa's lavapipe is a real Vulkan device that runs on the CPU: 40-230x
    slower than the CPU backend, so never a GPU by default. The GPU tier
    (scripts/gpu_tier.sh) and a developer checking the device code paths on
    a machine without a GPU set ``MTP_STUDIO_SOFTWARE_GPU=1``.
    """
    return os.environ.get(SOFTWARE_GPU_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def expose_software_devices() -> None:
    """Let ggml-vulkan list a CPU-type device when a software GPU was asked for.

    ggml-vulkan skips devices that are neither discrete nor integrated GPUs
    unless ``GGML_VK_VISIBLE_DEVICES`` names them; it reads the variable when
    the backend first initialises, so this runs before ``llama_backend_init``.
    A value the user set is left alone; otherwise the first Vulkan device is
    named, which on a machine without a GPU is the software one.
    """
    if software_gpu_requested() and "GGML_VK_VISIBLE_DEVICES" not in os.environ:
        os.environ["GGML_VK_VISIBLE_DEVICES"] = "0"


def engine_lib_dir(llama_cpp: Any) -> Path:
    """The folder llama_cpp loads its shared libraries from (``LLAMA_CPP_LIB_PATH`` wins, as in llama_cpp)."""
    override = os.environ.get("LLAMA_CPP_LIB_PATH")
    return Path(override) if override else Path(llama_cpp.__file__).parent / "lib"


def _load_backend_libraries(llama_cpp: Any) -> None:
    """Load the backends of an installer's engine (``packaging/build_engine_libs.py``).

    That build links no backend into libggml: each CPU variant
    (``libggml-cpu-haswell.so``...) and each GPU backend is a library of its
    own, and ggml picks the best CPU variant this CPU can run. Left to itself,
    ``llama_backend_init`` looks for them beside the *executable* -- the
    interpreter, or the frozen app's launcher -- not beside libggml, and
    would find none ("no backends are loaded"). So they are loaded from the
    folder llama_cpp loads libggml from. A developer build (backends linked
    in, no variant files) is left alone.
    """
    lib_dir = engine_lib_dir(llama_cpp)
    if not any(lib_dir.glob("*ggml-cpu-*")):
        return
    ggml = _ggml_cdll(lib_dir)
    if ggml is None:
        return
    ggml.ggml_backend_load_all_from_path.argtypes = [ctypes.c_char_p]
    ggml.ggml_backend_load_all_from_path.restype = None
    ggml.ggml_backend_load_all_from_path(str(lib_dir).encode())


def _ggml_cdll(lib_dir: Path) -> Any:
    for name in ("libggml.so", "libggml.dylib", "ggml.dll"):
        if (lib_dir / name).exists():
            return ctypes.CDLL(str(lib_dir / name))
    return None


def loaded_backends() -> list[dict[str, str]]:
    """Which backends ggml registered in this process, and from which library file.

    The library file is what tells an installer's CPU variants apart (they all
    register as "CPU"); it is read from the process's memory map where the OS
    has one (Linux), else left empty.
    """
    lib = llama()
    ggml = _ggml_cdll(engine_lib_dir(lib))
    if ggml is None:
        return []
    ggml.ggml_backend_reg_count.restype = ctypes.c_size_t
    ggml.ggml_backend_reg_get.restype = ctypes.c_void_p
    ggml.ggml_backend_reg_get.argtypes = [ctypes.c_size_t]
    ggml.ggml_backend_reg_name.restype = ctypes.c_char_p
    ggml.ggml_backend_reg_name.argtypes = [ctypes.c_void_p]
    names = [(ggml.ggml_backend_reg_name(ggml.ggml_backend_reg_get(i)) or b"").decode()
             for i in range(ggml.ggml_backend_reg_count())]
    files = _mapped_backend_files()
    out = []
    for name in names:
        key = {"CPU": "cpu"}.get(name, name.lower())
        match = [f for f in files if f.startswith(f"libggml-{key}") or f.startswith(f"ggml-{key}")]
        out.append({"name": name, "library": match[0] if match else ""})
    return out


def _mapped_backend_files() -> list[str]:
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return []
    names = {Path(line.split()[-1]).name for line in maps.splitlines() if "ggml-" in line and "/" in line}
    return sorted(n for n in names if n.split(".")[0] not in ("libggml-base",))


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
        info.update({k: data[k] for k in ("backend", "patch_hash", "patches", "cmake_args", "cache_key")
                     if k in data})
    except (OSError, ValueError):
        info["backend"] = "unknown (not installed by packaging/build_engine.py)"
    if os.environ.get("LLAMA_CPP_LIB_PATH"):  # the record then describes the wheel, not the library loaded
        info["lib_path"] = os.environ["LLAMA_CPP_LIB_PATH"]
    return info
