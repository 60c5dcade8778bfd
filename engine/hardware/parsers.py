"""Parsers for what system tools print about GPUs, kept apart from running
them so they are tested against recorded samples (tests/data/hardware/).

Each returns a list of :class:`GPU`; unknown or partial output yields what
can be read, never an exception.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SOFTWARE_RENDERERS = ("llvmpipe", "lavapipe", "swiftshader", "softpipe")


@dataclass(frozen=True)
class GPU:
    vendor: str  # nvidia | amd | intel | apple | other
    name: str
    memory_mib: int | None = None
    driver: str | None = None
    api: str = ""  # cuda | rocm | vulkan | metal
    software: bool = False  # a software renderer (lavapipe), listed only when asked for


def parse_nvidia_smi_csv(text: str) -> list[GPU]:
    """``nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader,nounits``."""
    gpus = []
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 3 or not parts[0] or parts[0].lower().startswith("name"):
            continue
        try:
            mem = int(float(parts[1]))
        except ValueError:
            continue  # not a GPU line (an error message, a header)
        gpus.append(GPU("nvidia", parts[0], mem, parts[2], "cuda"))
    return gpus


def parse_vulkaninfo_summary(text: str, software: bool = False) -> list[GPU]:
    """``vulkaninfo --summary``: the "Devices:" section, one ``GPUn:`` block per device.

    Software renderers (llvmpipe and friends) are left out: they are the CPU.
    With ``software`` (``MTP_STUDIO_SOFTWARE_GPU=1``) they are listed, marked
    ``software``, so the device code paths can be run on a machine without a GPU.
    """
    gpus = []
    for block in re.split(r"\n\s*GPU\d+:\s*\n", "\n" + text)[1:]:
        fields: dict[str, str] = {}
        for line in block.splitlines():
            m = re.match(r"\s*(\w+)\s*=\s*(.*)", line)
            if m:
                fields.setdefault(m.group(1), m.group(2).strip())
        name = fields.get("deviceName", "")
        if not name:
            continue
        is_software = (any(s in name.lower() for s in SOFTWARE_RENDERERS)
                       or fields.get("deviceType", "").startswith("PHYSICAL_DEVICE_TYPE_CPU"))
        if is_software and not software:
            continue
        vendor_id = fields.get("vendorID", "").lower()
        vendor = {"0x10de": "nvidia", "0x1002": "amd", "0x8086": "intel", "0x106b": "apple"}.get(vendor_id, "other")
        gpus.append(GPU(vendor, name, None, fields.get("driverInfo") or fields.get("driverVersion"), "vulkan",
                        software=is_software))
    return gpus


def parse_kfd_topology(nodes: dict[str, str]) -> list[GPU]:
    """ROCm's ``/sys/class/kfd/kfd/topology/nodes/<n>/properties`` (by node).

    A node with ``simd_count 0`` is a CPU; GPU nodes carry ``gfx_target_version``.
    """
    gpus = []
    def number(values: dict[str, str], key: str) -> int:
        try:
            return int(values.get(key, "0"))
        except ValueError:
            return 0

    for _node, props in sorted(nodes.items()):
        values = dict(line.split(maxsplit=1) for line in props.splitlines() if len(line.split()) == 2)
        if number(values, "simd_count") == 0:
            continue
        gfx = number(values, "gfx_target_version")
        name = f"AMD gfx{gfx // 10000}{(gfx // 100) % 100:x}{gfx % 100:x}" if gfx else "AMD GPU"
        gpus.append(GPU("amd", name, None, None, "rocm"))
    return gpus


def parse_rocminfo(text: str) -> list[GPU]:
    """``rocminfo``: one "Agent N" block per device; GPUs have ``Device Type: GPU``."""
    gpus = []
    for block in re.split(r"\*{5,}\s*\nAgent \d+\s*\n\*{5,}", text)[1:]:
        fields: dict[str, str] = {}
        for line in block.splitlines():
            key, sep, value = line.partition(":")
            if sep and key.strip() not in fields:
                fields[key.strip()] = value.strip()
        if fields.get("Device Type") != "GPU":
            continue
        name = fields.get("Marketing Name") or fields.get("Name", "AMD GPU")
        gpus.append(GPU("amd", name, None, None, "rocm"))
    return gpus


def parse_system_profiler_json(text: str) -> list[GPU]:
    """``system_profiler SPDisplaysDataType -json`` on macOS."""
    import json

    try:
        items = json.loads(text).get("SPDisplaysDataType", [])
    except (ValueError, AttributeError):
        return []
    gpus = []
    for item in items if isinstance(items, list) else []:
        name = item.get("sppci_model") or item.get("_name")
        if not name:
            continue
        vendor = "apple" if str(name).startswith("Apple") else ("amd" if "AMD" in str(name) else "other")
        gpus.append(GPU(vendor, str(name), None, None, "metal"))
    return gpus


def parse_system_profiler_displays(text: str) -> list[GPU]:
    """``system_profiler SPDisplaysDataType`` on macOS (text form)."""
    gpus = []
    for m in re.finditer(r"Chipset Model:\s*(.+)", text):
        name = m.group(1).strip()
        vendor = "apple" if name.startswith("Apple") else ("amd" if "AMD" in name else "other")
        gpus.append(GPU(vendor, name, None, None, "metal"))
    return gpus


def parse_cpuinfo(text: str) -> tuple[str, list[str]]:
    """CPU model name and feature flags from ``/proc/cpuinfo`` (x86 or ARM)."""
    model, flags = "", []  # type: str, list[str]
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key in ("model name", "Hardware", "Model") and not model:
            model = value.strip()
        elif key in ("flags", "Features") and not flags:
            flags = value.split()
    return model, flags
