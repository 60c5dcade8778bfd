"""Which devices a model's layers go to when remote (ggml RPC) servers are named.

The trunk is split across the remote devices and this machine's device;
this machine's device is listed last, so the last blocks — a combined
file's MTP (NextN) blocks — and the output layer stay here, as does the MTP
context's KV cache (llama.cpp allocates each layer's cache on that layer's
device). A sidecar MTP head is a model of its own and is always loaded
without the remote devices. See docs/multi-machine.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.errors import RpcError
from engine.rpc import parse_endpoints, split
from engine.runtime import rpc


@dataclass
class Placement:
    devices: Any  # the NULL-terminated device array llama.cpp gets
    names: list[str]
    tensor_split: list[float]
    main_device: int | None
    lines: list[str] = field(default_factory=list)  # what goes where, for the user
    local: Any = None  # this machine's devices alone (NULL-terminated), for a sidecar MTP head

    def model_kwargs(self) -> dict[str, Any]:
        return {"n_gpu_layers": -1, "devices": self.devices, "tensor_split": self.tensor_split,
                "main_device": self.main_device}

    def local_kwargs(self) -> dict[str, Any]:
        """A sidecar MTP head: wholly on this machine's device, never on a remote one."""
        return {"n_gpu_layers": -1, "devices": self.local}


def plan(servers: tuple[str, ...], *, block_count: int, mtp_blocks: int,
         tensor_split: tuple[float, ...] = (), main_device: int | None = None) -> Placement:
    """Connect to ``servers`` and choose the split.

    ``mtp_blocks``: how many trailing blocks must stay local (a combined
    file's NextN blocks when MTP is on; 0 otherwise). ``tensor_split`` is one
    share per device, remote devices first, this machine's last (llama.cpp's
    ``--tensor-split``); empty: by free memory, as llama.cpp does.

    Raises:
        RpcError: a server is unreachable, or the split does not match the devices.
    """
    remote = rpc.connect(parse_endpoints(servers))
    local = rpc.local_devices()
    devices = remote + local
    names = [f"{d.name}[{d.description}]" if d.remote else f"{d.name} (this machine)" for d in devices]
    if main_device is not None:
        if not 0 <= main_device < len(devices):
            raise RpcError(f"main device {main_device} does not exist; the devices are "
                           + ", ".join(f"{i}: {n}" for i, n in enumerate(names)))
        return Placement(rpc.device_array(devices), names, [], main_device,
                         [f"{names[main_device]}: the whole model"], rpc.device_array(local))
    if tensor_split:
        if len(tensor_split) != len(devices) or any(x < 0 for x in tensor_split) or not sum(tensor_split) > 0:
            raise RpcError(f"tensor split {list(tensor_split)} needs {len(devices)} non-negative shares, one per "
                           "device: " + ", ".join(f"{i}: {n}" for i, n in enumerate(names)))
        shares = [float(x) for x in tensor_split]
    else:
        shares = [float(d.free or d.total or 1) for d in devices]
    if mtp_blocks:
        shares = split.keep_tail_local(shares, block_count, mtp_blocks)
    placement = split.layer_devices(block_count, shares)
    return Placement(rpc.device_array(devices), names, shares, None,
                     split.describe(block_count, placement, names, mtp_blocks), rpc.device_array(local))
