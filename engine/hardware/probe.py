"""What this machine is: OS, CPU, RAM, GPUs, and what the engine build sees.

GPU tools and drivers can hang or crash, so :func:`probe` runs the work in a
short-lived child process with a timeout; the app only ever sees a JSON
report or a clear "the probe timed out".
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from engine.build_record import read_record
from engine.hardware import memory, nvidia, parsers
from engine.hardware.parsers import GPU

PROBE_TIMEOUT_S = 30.0
TOOL_TIMEOUT_S = 8.0
IMPORTANT_CPU_FLAGS = ("avx", "avx2", "fma", "f16c", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile",
                       "neon", "asimd", "sve", "dotprod")


@dataclass(frozen=True)
class EngineDevice:
    """A device in llama.cpp's backend registry, as the engine build sees it (``ggml_backend_dev_*``)."""

    name: str
    description: str
    type: str  # cpu | gpu | igpu | accel | other
    free_mib: int
    total_mib: int

    @property
    def is_gpu(self) -> bool:
        return self.type.lower() in ("gpu", "igpu")


@dataclass(frozen=True)
class LoadedBackend:
    """A backend ggml registered and the library it came from: which CPU variant or GPU library it chose."""

    name: str
    library: str = ""


@dataclass
class HardwareReport:
    """What ``mtp-studio hardware --json`` prints, typed: the machine, its GPUs, the engine build (``engine``:
    ``native.build_info()`` and the loaded backends) and the devices that build sees."""

    os: str
    machine: str
    cpu_model: str
    cpu_flags: list[str]
    cores: int
    ram_mib: int | None
    gpus: list[GPU] = field(default_factory=list)
    engine: dict[str, Any] = field(default_factory=dict)
    engine_devices: list[EngineDevice] = field(default_factory=list)
    gpu_offload: bool = False
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> HardwareReport:
        """Read a report; keys it does not own (the CLI's ``fingerprint`` and ``recommendation``, which are
        worked out from the report again) are left out."""
        known = {f.name for f in fields(cls)}
        data = {k: v for k, v in data.items() if k in known}
        data["gpus"] = [GPU(**g) for g in data.get("gpus", [])]
        data["engine_devices"] = [EngineDevice(**d) for d in data.get("engine_devices", [])]
        return cls(**data)

    @property
    def backend(self) -> str:
        """The engine build's backend as its record names it ("cpu", "cuda", or "unknown (…)")."""
        return str(self.engine.get("backend", "unknown"))

    @property
    def engine_version(self) -> str | None:
        """The llama-cpp-python version of the engine build."""
        version = self.engine.get("llama_cpp_python")
        return None if version is None else str(version)

    @property
    def loaded_backends(self) -> list[LoadedBackend]:
        return [LoadedBackend(str(b.get("name")), b.get("library") or "") for b in self.engine.get("loaded_backends")
                or []]

    @property
    def gpu_devices(self) -> list[EngineDevice]:
        """The engine's devices that are GPUs (integrated ones too)."""
        return [d for d in self.engine_devices if d.is_gpu]

    def fingerprint(self) -> str:
        """Stable across restarts; changes with the GPU, its driver, or the engine build."""
        ident = {
            "os": self.os.split()[0] if self.os else "", "machine": self.machine, "cpu": self.cpu_model,
            "cores": self.cores, "ram_gib": round((self.ram_mib or 0) / 1024),
            "gpus": sorted((g.name, g.driver or "", g.memory_mib or 0) for g in self.gpus),
            "engine": [self.engine.get("llama_cpp_python"), self.engine.get("backend"),
                       self.engine.get("patch_hash"), self.engine.get("cache_key")],
        }
        return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]


def _run(cmd: list[str]) -> str | None:
    if shutil.which(cmd[0]) is None:
        return None
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _gpus(notes: list[str]) -> list[GPU]:
    from engine.runtime import native

    gpus: list[GPU] = _nvidia_gpus()
    kfd = Path("/sys/class/kfd/kfd/topology/nodes")
    if kfd.is_dir():
        nodes = {p.name: _read(str(p / "properties")) for p in kfd.iterdir()}
        gpus += parsers.parse_kfd_topology(nodes)
    elif (out := _run(["rocminfo"])) is not None:
        gpus += parsers.parse_rocminfo(out)
    if sys.platform == "darwin":
        out = _run(["system_profiler", "SPDisplaysDataType", "-json"])
        if out:
            gpus += parsers.parse_system_profiler_json(out)
    out = _run(["vulkaninfo", "--summary"])
    if out:
        known = {g.name for g in gpus}
        listed = parsers.parse_vulkaninfo_summary(out, software=native.software_gpu_requested())
        gpus += [g for g in listed if g.name not in known]
    if not gpus:
        notes.append("No GPU found (NVML, nvidia-smi, ROCm topology, vulkaninfo).")
    return gpus


def _nvidia_gpus() -> list[GPU]:
    """NVML first (typed, no process); ``nvidia-smi`` where NVML cannot be loaded."""
    gpus = nvidia.nvml_gpus()
    if gpus is not None:
        return gpus
    out = _run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader,nounits"])
    return parsers.parse_nvidia_smi_csv(out) if out else []


def engine_devices() -> tuple[list[EngineDevice], bool]:
    """Devices llama.cpp's backend registry reports, bound with ctypes on its libggml."""
    import ctypes

    from engine.runtime import native

    lib = native.llama()
    offload = bool(lib.llama_supports_gpu_offload())
    ggml = _ggml_library(lib)
    if ggml is None:
        return [], offload
    ggml.ggml_backend_dev_count.restype = ctypes.c_size_t
    ggml.ggml_backend_dev_get.restype = ctypes.c_void_p
    ggml.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
    for fn in ("ggml_backend_dev_name", "ggml_backend_dev_description"):
        getattr(ggml, fn).restype = ctypes.c_char_p
        getattr(ggml, fn).argtypes = [ctypes.c_void_p]
    ggml.ggml_backend_dev_type.restype = ctypes.c_int
    ggml.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
    ggml.ggml_backend_dev_memory.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t),
                                             ctypes.POINTER(ctypes.c_size_t)]
    types = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel"}
    devices = []
    for i in range(ggml.ggml_backend_dev_count()):
        dev = ggml.ggml_backend_dev_get(i)
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        ggml.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        devices.append(EngineDevice(
            name=(ggml.ggml_backend_dev_name(dev) or b"").decode(),
            description=(ggml.ggml_backend_dev_description(dev) or b"").decode(),
            type=types.get(ggml.ggml_backend_dev_type(dev), "other"),
            free_mib=free.value // 2**20, total_mib=total.value // 2**20,
        ))
    return devices, offload


def _ggml_library(lib: Any) -> Any:
    import ctypes

    lib_dir = Path(lib.__file__).parent / "lib"
    for name in ("libggml.so", "libggml.dylib", "ggml.dll"):
        if (lib_dir / name).exists():
            return ctypes.CDLL(str(lib_dir / name))
    return None


def collect() -> HardwareReport:
    """Gather the report in this process (the child side of :func:`probe`)."""
    from engine.runtime import native

    notes: list[str] = []
    model, flags = parsers.parse_cpuinfo(_read("/proc/cpuinfo"))
    if not model and sys.platform == "darwin":
        model = (_run(["sysctl", "-n", "machdep.cpu.brand_string"]) or "").strip()
    ram = memory.total_ram_mib()
    report = HardwareReport(
        os=f"{platform.system()} {platform.release()}", machine=platform.machine(),
        cpu_model=model or platform.processor(), cpu_flags=[f for f in flags if f in IMPORTANT_CPU_FLAGS],
        cores=os.cpu_count() or 1, ram_mib=ram, gpus=_gpus(notes), engine=native.build_info(), notes=notes,
    )
    try:
        report.engine_devices, report.gpu_offload = engine_devices()
        report.engine["loaded_backends"] = native.loaded_backends()  # which CPU variant / GPU library ggml chose
        # "dynamic": an installer's engine, whose backends ggml picks at start (engine/hardware/recommend.py)
        report.engine["backend_loading"] = read_record().get("backend_loading", "linked in")
    except Exception as exc:  # a broken engine build is itself a finding
        report.notes.append(f"The engine could not list its devices: {exc}")
    return report


CHILD_CODE = "import json; from engine.hardware.probe import collect; print(json.dumps(collect().to_json()))"


def probe(timeout: float = PROBE_TIMEOUT_S, code: str = CHILD_CODE) -> HardwareReport:
    """Run :func:`collect` in a child process; a hang or crash there is reported, not inherited.

    ``code`` is what the child runs (tests substitute a child that hangs or dies).
    """
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return _fallback(f"The hardware probe did not finish within {timeout:.0f} s (a GPU driver hung?).")
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        return _fallback(f"The hardware probe failed (exit {proc.returncode}): {proc.stderr.strip()[-300:]}")
    return HardwareReport.from_json(json.loads(lines[-1]))


def _fallback(note: str) -> HardwareReport:
    from engine.runtime import native

    return HardwareReport(os=f"{platform.system()} {platform.release()}", machine=platform.machine(),
                          cpu_model=platform.processor(), cpu_flags=[], cores=os.cpu_count() or 1, ram_mib=None,
                          engine=native.build_info(), notes=[note])
