"""How many sequences a model is loaded with when nobody chose: ``mtp-studio serve`` without
``--parallel``, and the app's "Replies at once: Auto" (``LoadOptions.parallel`` 0, resolved as the worker
reads the load plan).

llama-server decodes 4 requests at once by default; agents, their sub-agents and an editor beside a chat
send several, and the app's chat and its local server share one worker. Ours gives each sequence
``n_ctx`` tokens of its own (no request fails because others filled a shared pool), so 4 sequences hold 4
times the KV cache: the default is 4 where that fits in memory beside the model, else 2, else 1. The
estimate is read from the GGUF header (engine/store/fit.py), before llama.cpp loads anything; it counts
RAM, not a GPU's own memory, so the worker loads one sequence where Auto's do not fit there
(engine/worker/server.py, ``Worker._session``).
"""

from __future__ import annotations

from pathlib import Path

from engine.errors import ModelFileError
from engine.store.fit import estimates

AUTO = 0  # LoadOptions.parallel: as many as fit, up to DEFAULT_PARALLEL
DEFAULT_PARALLEL = 4
CHOICES = (4, 2, 1)
SHARE = 0.8  # of the memory available now, at most (fit.py's "tight" above it)


def default_parallel(path: str | Path, *, n_ctx: int, sidecar: str | Path | None = None,
                     available: int | None = None) -> tuple[int, str]:
    """The sequences to load ``path`` with, and a line saying why.

    ``available``: bytes of memory to fit in (default: what this machine has free now). Where the
    estimate cannot be made (memory unknown, a header it cannot read) it is :data:`DEFAULT_PARALLEL`, as
    llama-server's: the load itself then says what does not fit.
    """
    try:  # one read of the headers for every count (each read of a real vocabulary's header takes ~0.2 s)
        sized = estimates(path, [n_ctx * n for n in CHOICES], sidecar=sidecar, available=available)
    except (ModelFileError, OSError, ValueError) as exc:
        return DEFAULT_PARALLEL, f"{DEFAULT_PARALLEL} requests at once (memory not estimated: {exc})"
    free = sized[0].available
    if free is None:
        return DEFAULT_PARALLEL, f"{DEFAULT_PARALLEL} requests at once (free memory unknown)"
    budget = SHARE * free
    # the most sequences that fit; one even where nothing does (the load then says so)
    n, need = next(((more, e.total) for more, e in zip(CHOICES, sized, strict=True) if e.total <= budget),
                   (1, sized[-1].total))
    if n == DEFAULT_PARALLEL:
        why = f"{n} sequences of {n_ctx} tokens need ~{_size(need)}"
    else:
        why = (f"{DEFAULT_PARALLEL} sequences of {n_ctx} tokens would not fit in {_size(budget)}; "
               f"{n} need ~{_size(need)}")
    return n, f"{n} request{'s' if n > 1 else ''} at once ({why}; --parallel N to choose)"


def _size(n_bytes: float) -> str:
    return f"{n_bytes / 2**30:.1f} GiB" if n_bytes >= 2**30 else f"{n_bytes / 2**20:.0f} MiB"
