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
    if active != want:
        reasons.append(f"The engine is {_backend_text(active)}; build the {BACKEND_NAMES.get(want, want)} engine.")
    else:
        reasons.append(f"The active engine ({_backend_text(active)}) matches.")
    if "amx_tile" in report.cpu_flags:
        reasons.append("The CPU reports AMX; the engine is built without AMX kernels, which crash (SIGILL) here.")
    return Recommendation(want, active, reasons)


def _backend_text(backend: str) -> str:
    return BACKEND_NAMES.get(backend, backend)
