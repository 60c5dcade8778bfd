"""Where llama.cpp puts each layer when a model is split across devices.

This is ``llama_model_base::load_tensors``'s rule, restated so the engine can
plan before loading (``models fit``) and choose a split that keeps the MTP
head local: the offloaded layers are the *last* ``n_gpu_layers`` of
``0..n_layer_all`` (``n_layer_all`` = the output layer), and layer ``il`` goes
to the first device whose cumulative share exceeds
``(il - first_offloaded) / offloaded``. The MTP (NextN) blocks are the last
blocks of a combined file, so they, with the output layer, land on the *last*
device of the list: the engine lists the remote devices first and the local
one last (llama.cpp's own default order puts RPC servers first too), and
:func:`keep_tail_local` makes sure the last device's share covers them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

CPU = -1  # a layer that is not offloaded stays on the host CPU


def _cumulative(weights: Sequence[float]) -> np.ndarray:
    w = np.asarray(weights, dtype=np.float32)
    if len(w) == 0 or float(w.sum()) <= 0 or (w < 0).any():
        raise ValueError(f"a split needs non-negative shares with a positive sum, got {list(weights)}")
    return np.cumsum(w, dtype=np.float32) / np.float32(w.sum())  # float32, as llama.cpp computes it


def layer_devices(n_layer_all: int, weights: Sequence[float], n_gpu_layers: int = -1) -> list[int]:
    """Device index (into ``weights``) of each layer ``0..n_layer_all``; the last entry is the
    output layer. :data:`CPU` for layers left on the host."""
    splits = _cumulative(weights)
    ngl = n_layer_all + 1 if n_gpu_layers < 0 else n_gpu_layers
    first = max(n_layer_all + 1 - ngl, 0)
    active = min(ngl, n_layer_all + 1)
    out = []
    for il in range(n_layer_all + 1):
        if il < first or il - first >= active:
            out.append(CPU)
            continue
        frac = np.float32(il - first) / np.float32(active)
        out.append(min(int(np.searchsorted(splits, frac, side="right")), len(splits) - 1))
    return out


def keep_tail_local(weights: Sequence[float], n_layer_all: int, n_tail: int) -> list[float]:
    """Shares like ``weights`` but with the last device's share raised (if needed) so
    that the last ``n_tail`` blocks and the output layer are placed on it.

    Every layer offloaded (``n_gpu_layers`` = all). The other devices keep
    their proportions to each other.
    """
    shares = [float(w) for w in weights]
    if len(shares) < 2:
        return shares
    first_tail = n_layer_all - n_tail
    for _ in range(64):
        if all(d == len(shares) - 1 for d in layer_devices(n_layer_all, shares)[first_tail:]):
            return shares
        head = sum(shares[:-1])
        frac = first_tail / (n_layer_all + 1)
        if frac <= 0:  # everything is tail: nothing is left for the remote devices
            return [0.0] * (len(shares) - 1) + [1.0]
        need = head * (1 - frac) / frac
        shares[-1] = max(need * 1.0001, shares[-1] * 1.01, 1e-6)
    raise AssertionError("keep_tail_local did not converge")  # pragma: no cover


def describe(n_layer_all: int, placement: Sequence[int], names: Sequence[str], n_tail: int = 0) -> list[str]:
    """One line per device: which blocks it holds (``output`` for the output layer)."""
    lines = []
    for d, name in [(CPU, "CPU (host)"), *enumerate(names)]:
        layers = [il for il, dev in enumerate(placement) if dev == d]
        if not layers:
            continue
        blocks = [il for il in layers if il < n_layer_all]
        parts = []
        if blocks:
            parts.append(f"blocks {blocks[0]}-{blocks[-1]}" if len(blocks) > 1 else f"block {blocks[0]}")
        if n_tail and any(il >= n_layer_all - n_tail for il in blocks):
            parts.append("MTP head")
        if n_layer_all in layers:
            parts.append("output")
        lines.append(f"{name}: {', '.join(parts)}")
    return lines
