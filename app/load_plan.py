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
from engine.errors import ModelFileError
from engine.hardware.probe import HardwareReport
from engine.store import fit
from engine.store.library import projectors_beside
from engine.store.projectors import diagnose_projector

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
class ProjectorOption:
    """A vision projector the sheet offers for the target, checked against it (the doctor's check)."""

    path: str
    size: int  # bytes: its weights, loaded beside the model's
    fits: bool
    verdict: str  # the doctor's words: why it fits or not

    @property
    def label(self) -> str:
        return f"{Path(self.path).name} ({self.size / 2**20:,.0f} MiB)" + ("" if self.fits else " — does not fit")


def projector_option(target: str, path: str) -> ProjectorOption:
    """``path`` checked against ``target`` from both headers; a file that is no projector says so."""
    try:
        diagnosis = diagnose_projector(target, path)
    except ModelFileError as exc:
        size = Path(path).stat().st_size if Path(path).is_file() else 0
        return ProjectorOption(path, size, False, f"{Path(path).name} cannot be read as a projector: {exc}")
    return ProjectorOption(path, diagnosis.projector.file_size, diagnosis.ok, diagnosis.report())


@dataclass(frozen=True)
class SheetFacts:
    path: str  # the file itself (the built-in model's too)
    layers: int  # offloadable layers: the trunk's
    n_ctx_train: int
    has_mtp: bool
    projectors: tuple[ProjectorOption, ...] = ()  # beside the target (its repository's), and the one chosen


def read_sheet_facts(path: str | None, mmproj: str | None = None) -> SheetFacts:
    """The header facts the sheet needs (on the background runner: the built-in model may be assembled first),
    with the projectors in the target's folder and ``mmproj`` (the one chosen before), each checked."""
    resolved = Path(path) if path else default_model.default_model_path()
    facts = engine.gguf.facts.read_facts(resolved)
    found = [str(p) for p in projectors_beside(resolved)] if path else []
    if mmproj and mmproj not in found:
        found.append(mmproj)
    options = tuple(projector_option(str(resolved), p) for p in found)
    return SheetFacts(str(resolved), facts.trunk_layers, facts.context_length, facts.has_mtp, options)


@dataclass(frozen=True)
class MemoryPlan:
    """Where the estimate lands: RAM, and VRAM when layers are offloaded."""

    estimate: fit.MemoryEstimate
    ram_need: int
    vram_need: int
    vram_have: int | None
    projector: int = 0  # bytes of the vision projector's weights, counted in ram_need or vram_need

    @property
    def total(self) -> int:
        return self.estimate.total + self.projector


def plan_memory(path: str, n_ctx: int, sidecar: str | None, mtp: bool, gpu_share: float,
                vram_have: int | None, projector: int = 0, swa_full: bool = False) -> MemoryPlan:
    """The estimate split between RAM and VRAM: offloaded layers take their share of the
    weights and caches to the GPU, which then also holds the compute buffers. A vision projector
    (``projector`` bytes) goes where mtmd puts it: on the GPU when any layer is, else in RAM.
    ``swa_full``: the preference that a sliding-window model keeps every cell (Settings.swa_full)."""
    est = fit.estimate(path, n_ctx=n_ctx, sidecar=sidecar, mtp=mtp, swa_full=swa_full)
    layered = est.weights + est.kv_cache + est.recurrent + est.mtp_context
    vram = int(layered * gpu_share) + (est.compute if gpu_share > 0 else 0)
    on_gpu = projector if gpu_share > 0 else 0
    return MemoryPlan(est, est.total - vram + projector - on_gpu, vram + on_gpu, vram_have, projector)


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
