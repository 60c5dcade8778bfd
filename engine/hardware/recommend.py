"""Which engine build fits this machine, with the reasons in plain words."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from engine.hardware.probe import HardwareReport

BACKEND_NAMES = {"cpu": "CPU-only", "cuda": "CUDA", "metal": "Metal", "vulkan": "Vulkan", "rocm": "ROCm (HIP)"}


@dataclass(frozen=True)
class Recommendation:
    backend: str
    active: str
    reasons: list[str] = field(default_factory=list)

    @property
    def matches(self) -> bool:
        return self.backend == self.active

    @property
    def command(self) -> str:
        return f"mtp-studio engine build --backend {self.backend}"


def recommend(report: HardwareReport) -> Recommendation:
    active = report.backend.split()[0]
    reasons: list[str] = []
    vendors = {g.vendor for g in report.gpus}
    if sys.platform == "darwin" and report.machine == "arm64":
        want = "metal"
        reasons.append("Apple silicon: the GPU shares memory with the CPU; Metal uses it.")
    elif "nvidia" in vendors:
        want = "cuda"
        gpu = next(g for g in report.gpus if g.vendor == "nvidia")
        reasons.append(f"NVIDIA GPU found ({gpu.name}" + (f", {gpu.memory_mib} MiB" if gpu.memory_mib else "") + ").")
    elif any(g.vendor == "amd" and g.api == "rocm" for g in report.gpus):
        want = "rocm"
        reasons.append("AMD GPU with ROCm found.")
    elif report.gpus:
        want = "vulkan"
        reasons.append(f"GPU found ({report.gpus[0].name}); Vulkan drives it.")
    else:
        want = "cpu"
        reasons.append("No GPU found: the CPU engine is the right one.")
    chosen = run_time_choice(report)
    if chosen:
        reasons.append(chosen)
    if chosen and want == "cpu":  # an installer's engine carries every CPU variant: nothing to build
        want = active
    if active != want:
        reasons.append(f"The engine is {_backend_text(active)}; build the {BACKEND_NAMES.get(want, want)} engine.")
    else:
        reasons.append(f"The active engine ({_backend_text(active)}) matches.")
    if "amx_tile" in report.cpu_flags:
        reasons.append("The CPU reports AMX; the engine is built without AMX kernels, which crash (SIGILL) here.")
    return Recommendation(want, active, reasons)


def run_time_choice(report: HardwareReport) -> str:
    """For an installer's engine (backends loaded at run time): which one ggml chose, and why.

    That build (``packaging/build_engine_libs.py``) carries every CPU variant
    and maybe a GPU backend as libraries of their own; ggml keeps the best CPU
    variant for this processor and loads a GPU backend only when its runtime
    and a device are there. Empty for a developer build (backends linked in).
    """
    if report.engine.get("backend_loading") != "dynamic":
        return ""
    loaded = report.loaded_backends
    cpu = next((b.library for b in loaded if b.name == "CPU" and b.library), "")
    cpu_text = f"the CPU ({cpu}, the best of its CPU variants for this processor)" if cpu else "the CPU"
    carried = report.backend.split()[0]
    if carried in ("cpu", "unknown"):
        return f"This engine picks its backend at start: it runs on {cpu_text}."
    gpu = next((b for b in loaded if b.name not in ("CPU", "RPC")), None)
    if report.gpu_devices:
        d = report.gpu_devices[0]
        lib = f" ({gpu.library})" if gpu and gpu.library else ""
        return (f"This engine picks its backend at start: GPU layers run on {d.name} ({d.description}) through "
                f"{_backend_text(carried)}{lib}, the rest on {cpu_text}.")
    why = (f"its {_backend_text(carried)} backend loaded but found no GPU" if gpu else
           f"its {_backend_text(carried)} backend did not load (no {_backend_text(carried)} runtime or driver here)")
    return f"This engine picks its backend at start: it runs on {cpu_text}; {why}."


def _backend_text(backend: str) -> str:
    return BACKEND_NAMES.get(backend, backend)
