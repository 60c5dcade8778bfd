"""Memory on this machine, by psutil: the same call on Linux, macOS and Windows.

It replaces reading ``/proc/meminfo`` by hand, which only Linux has (the
fallback then was ``sysconf``, which macOS answers and Windows does not).
"""

from __future__ import annotations

import psutil


def total_ram_mib() -> int | None:
    """Physical memory in MiB; None when the system does not say."""
    try:
        return int(psutil.virtual_memory().total) // 2**20
    except (OSError, RuntimeError):
        return None


def available_ram_bytes() -> int | None:
    """Memory a new model can take without swapping ("MemAvailable" on Linux), in bytes."""
    try:
        return int(psutil.virtual_memory().available)
    except (OSError, RuntimeError):
        return None
