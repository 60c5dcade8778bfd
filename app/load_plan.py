"""What a load will need, worked out before it is sent: the header facts the load sheet shows, whether the
engine build can offload layers to a GPU, the memory estimate split between RAM and GPU memory, and the GPU
memory the hardware probe found.

Reading a header touches the model file (possibly on a slow disk), so these run on the background runner.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import engine.gguf.facts
from engine import default_model
from engine.hardware.probe import HardwareReport
from engine.store import fit

GPU_BACKENDS = ("cuda", "metal", "vulkan", "rocm", "hip", "sycl")


def gpu_offload_reason(backend: str | None) -> str:
    """Why GPU layers cannot be set on this engine build ("" when they can)."""
    if backend is None:
        return "The engine has not started yet, so whether it can use a GPU is not known."
    kind = backend.split()[0].lower() if backend.strip() else "unknown"
    if kind in GPU_BACKENDS:
        return ""
    if kind == "cpu":
        return ("This engine build is CPU-only, so every layer runs on the CPU. To offload layers to a GPU, "
                "build the engine for it: mtp-studio engine build --backend cuda (or metal, vulkan, rocm).")
    return (f"The engine build's backend is {backend}; GPU offload needs a cuda, metal, vulkan or rocm build "
            "(mtp-studio engine build --backend …).")


@dataclass(frozen=True)
class SheetFacts:
    path: str  # the file itself (the built-in model's too)
    layers: int  # offloadable layers: the trunk's
    n_ctx_train: int
    has_mtp: bool


def read_sheet_facts(path: str | None) -> SheetFacts:
    """The header facts the sheet needs (on the background runner: the built-in model may be assembled first)."""
    resolved = Path(path) if path else default_model.default_model_path()
    facts = engine.gguf.facts.read_facts(resolved)
    return SheetFacts(str(resolved), facts.trunk_layers, facts.context_length, facts.has_mtp)


@dataclass(frozen=True)
class MemoryPlan:
    """Where the estimate lands: RAM, and VRAM when layers are offloaded."""

    estimate: fit.MemoryEstimate
    ram_need: int
    vram_need: int
    vram_have: int | None


def plan_memory(path: str, n_ctx: int, sidecar: str | None, mtp: bool, gpu_share: float,
                vram_have: int | None) -> MemoryPlan:
    """The estimate split between RAM and VRAM: offloaded layers take their share of the
    weights and caches to the GPU, which then also holds the compute buffers."""
    est = fit.estimate(path, n_ctx=n_ctx, sidecar=sidecar, mtp=mtp)
    layered = est.weights + est.kv_cache + est.recurrent + est.mtp_context
    vram = int(layered * gpu_share) + (est.compute if gpu_share > 0 else 0)
    return MemoryPlan(est, est.total - vram, vram, vram_have)


def numbered_plan(serial: int, *args: Any) -> tuple[int, MemoryPlan | None, str]:
    """(serial, plan, "") or (serial, None, what went wrong): the number tells the sheet whether a newer
    change overtook this estimate, and travels with the result so only bound methods receive it (a lambda
    would outlive a closed sheet)."""
    try:
        return serial, plan_memory(*args), ""
    except Exception as exc:  # a header the estimate cannot read: said in the sheet
        return serial, None, str(exc) or type(exc).__name__


def vram_from_report(report: HardwareReport | None) -> int | None:
    """The largest GPU's memory, in bytes, as the hardware probe found it (None: no GPU known)."""
    if not report:
        return None
    devices = [d.free_mib or d.total_mib for d in report.gpu_devices]
    devices += [g.memory_mib or 0 for g in report.gpus]
    best = max(devices, default=0)
    return best * 2**20 if best else None
