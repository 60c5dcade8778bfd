"""How many sequences a model is loaded with when nobody chose: ``mtp-studio serve`` without
``--parallel``, and the app's "Replies at once: Auto" (``LoadOptions.parallel`` 0, resolved as the worker
reads the load plan).

llama-server decodes 4 requests at once by default; agents, their sub-agents and an editor beside a chat
send several, and the app's chat and its local server share one worker. Ours gives each sequence
``n_ctx`` tokens of its own (no request fails because others filled a shared pool), so 4 sequences hold 4
times the KV cache: the default is 4 where that fits in memory beside the model, else 2, else 1. The
estimate is read from the GGUF header (engine/store/fit.py), before llama.cpp loads anything. With layers
offloaded to a GPU (:class:`DeviceMemory`), the offloaded share of the weights, KV cache and recurrent state
and the compute buffers must fit in the GPU's own free memory, and the rest in RAM. Where the estimate is
still wrong, the worker loads one sequence (engine/worker/server.py, ``Worker._session``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from engine.errors import ModelFileError
from engine.store.fit import MemoryEstimate, estimates

AUTO = 0  # LoadOptions.parallel: as many as fit, up to DEFAULT_PARALLEL
DEFAULT_PARALLEL = 4
CHOICES = (4, 2, 1)
SHARE = 0.8  # of the memory available now, at most (fit.py's "tight" above it)


@dataclass(frozen=True)
class DeviceMemory:
    """The GPU side of a load: ``free`` bytes on the devices llama.cpp offloads to (their sum: layers are split
    across them), ``share`` of the model's layers offloaded (1.0: all), ``name`` for the line."""

    free: int
    share: float
    name: str = "the GPU"

    def need(self, e: MemoryEstimate) -> float:
        """What the device holds of ``e``: its share of what lives per layer, and the compute buffers (llama.cpp
        reserves them on the device that runs the offloaded layers)."""
        return self.share * (e.weights + e.kv_cache + e.recurrent + e.mtp_context) + e.compute


def default_parallel(path: str | Path, *, n_ctx: int, sidecar: str | Path | None = None,
                     available: int | None = None, device: DeviceMemory | None = None,
                     swa_full: bool = False, kv_unified: bool = True) -> tuple[int, str]:
    """The sequences to load ``path`` with, and a line saying why.

    ``available``: bytes of memory to fit in (default: what this machine has free now). ``device``: the
    GPU's, where layers are offloaded: both must hold their part. ``swa_full``: a sliding-window model's
    windowed layers keep every cell (LoadOptions.swa_full), not only each sequence's window; ``kv_unified``:
    one pool of cells for every sequence, else a pool each (LoadOptions.kv_unified). Where the
    estimate cannot be made (memory unknown, a header it cannot read) it is :data:`DEFAULT_PARALLEL`, as
    llama-server's: the load itself then says what does not fit.
    """
    try:  # one read of the headers for every count (each read of a real vocabulary's header takes ~0.2 s)
        sized = estimates(path, [n_ctx * n for n in CHOICES], sidecar=sidecar, available=available,
                          swa_full=swa_full, n_seqs=list(CHOICES), kv_unified=kv_unified)
    except (ModelFileError, OSError, ValueError) as exc:
        return DEFAULT_PARALLEL, f"{DEFAULT_PARALLEL} requests at once (memory not estimated: {exc})"
    free = sized[0].available
    if free is None:
        return DEFAULT_PARALLEL, f"{DEFAULT_PARALLEL} requests at once (free memory unknown)"
    budget = SHARE * free
    on_device = device is not None and device.share > 0
    device_budget = SHARE * device.free if on_device else 0.0

    def fits(e: MemoryEstimate) -> bool:
        if not on_device:
            return e.total <= budget
        gpu = device.need(e)
        return gpu <= device_budget and e.total - gpu <= budget

    def described(e: MemoryEstimate) -> str:
        if not on_device:
            return f"~{_size(e.total)}"
        gpu = device.need(e)
        return f"~{_size(gpu)} on {device.name} and ~{_size(e.total - gpu)} in RAM"

    # the most sequences that fit; one even where nothing does (the load then says so)
    n, chosen = next(((more, e) for more, e in zip(CHOICES, sized, strict=True) if fits(e)), (1, sized[-1]))
    if n == DEFAULT_PARALLEL:
        why = f"{n} sequences of {n_ctx} tokens need {described(chosen)}"
    else:
        room = f"{_size(device_budget)} of {device.name}'s memory and {_size(budget)} of RAM" if on_device \
            else _size(budget)
        why = f"{DEFAULT_PARALLEL} sequences of {n_ctx} tokens would not fit in {room}; {n} need {described(chosen)}"
    return n, f"{n} request{'s' if n > 1 else ''} at once ({why}; --parallel N to choose)"


def _size(n_bytes: float) -> str:
    return f"{n_bytes / 2**30:.1f} GiB" if n_bytes >= 2**30 else f"{n_bytes / 2**20:.0f} MiB"
