"""``models fit --rpc``: the memory estimate divided over remote (ggml RPC) devices and this machine.

The blocks go where llama.cpp will put them (``engine/rpc/split.py``, the
same rule and the same MTP-stays-local adjustment the load uses): each
block's weights exactly, from the GGUF's tensor list; the KV cache and
recurrent state in proportion to the trunk blocks a device holds; the token
embeddings (llama.cpp keeps the input layer on the host), the output layer,
the MTP head and the MTP context here. Every device reserves its own compute
buffer, so each is charged the full compute estimate.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from engine.gguf.facts import read_facts, shard_paths
from engine.gguf.header import read_header
from engine.rpc import split
from engine.store.fit import MemoryEstimate, estimate

_BLOCK = re.compile(r"^blk\.(\d+)\.")
MIB = 2**20


@dataclass(frozen=True)
class DeviceShare:
    name: str
    blocks: str  # which blocks, as split.describe says
    needed: int
    free: int | None

    @property
    def verdict(self) -> str:
        if self.free is None:
            return "unknown"
        return "won't fit" if self.needed > self.free else ("tight" if self.needed > 0.8 * self.free else "fits")

    def line(self) -> str:
        free = f"{self.free / MIB:9.1f} MiB free" if self.free is not None else "free unknown"
        return f"{self.name:<34} {self.needed / MIB:9.1f} MiB of {free} → {self.verdict}   ({self.blocks})"


def split_estimate(path: str | Path, devices: list[tuple[str, int | None]], *, n_ctx: int = 4096,
                   sidecar: str | Path | None = None, mtp: bool = True,
                   tensor_split: list[float] | None = None) -> tuple[MemoryEstimate, list[DeviceShare]]:
    """``devices``: (name, free bytes) — remote devices first, this machine last (as the load orders them)."""
    est = estimate(path, n_ctx=n_ctx, sidecar=sidecar, mtp=mtp, available=devices[-1][1])
    facts = read_facts(path)
    n_all = facts.block_count
    mtp_in_file = mtp and sidecar is None and facts.nextn_layers > 0
    shares = tensor_split or [float(free or 1) for _, free in devices]
    if len(shares) != len(devices):
        raise ValueError(f"--tensor-split needs {len(devices)} shares, one per device")
    if mtp_in_file:
        shares = split.keep_tail_local(shares, n_all, facts.nextn_layers)
    placement = split.layer_devices(n_all, shares)
    local = len(devices) - 1
    needed = [0] * len(devices)
    for shard in shard_paths(Path(path), facts.split_count):
        for t in read_header(shard).tensors:
            m = _BLOCK.match(t.name)
            if m:
                il = int(m.group(1))
                if il >= facts.trunk_layers and not mtp_in_file:
                    continue  # NextN blocks are loaded only when drafting with them
                dev = placement[il]
            elif t.name.startswith("token_embd"):
                dev = local  # the input layer stays on the host
            else:
                dev = placement[n_all]  # output, output_norm
            needed[dev if dev >= 0 else local] += t.n_bytes
    weights_here = sum(needed)
    needed[local] += max(0, est.weights - weights_here)  # a sidecar's blocks: all local
    trunk = [placement[il] for il in range(facts.trunk_layers)]
    for d in range(len(devices)):
        frac = trunk.count(d) / max(1, len(trunk))
        needed[d] += int((est.kv_cache + est.recurrent) * frac) + est.compute
    needed[local] += est.mtp_context + est.checkpoints  # the MTP context and the host copies stay here
    names = [name for name, _ in devices]
    lines = dict(line.rsplit(": ", 1)  # names hold host:port, never ": "
                 for line in split.describe(n_all, placement, names, facts.nextn_layers if mtp_in_file else 0))
    return est, [DeviceShare(name, lines.get(name, "no blocks"), needed[i], free)
                 for i, (name, free) in enumerate(devices)]
