"""NVIDIA GPUs through NVML (nvidia-ml-py), with ``nvidia-smi`` as the fallback.

NVML is the library ``nvidia-smi`` itself prints from: asking it directly
gives typed values (bytes, not a CSV column that may say "[N/A]") without
starting a process. It is missing where there is no NVIDIA driver, or where
the driver's ``libnvidia-ml`` is not on the library path (some containers);
then :func:`nvml_gpus` says None and the probe parses ``nvidia-smi``. The
probe runs in a child process with a timeout, so a hanging driver stays there.
"""

from __future__ import annotations

import contextlib
from typing import Any

from engine.hardware.parsers import GPU


def _text(value: Any) -> str:
    """nvidia-ml-py returns ``str`` since 11.5, ``bytes`` before."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def nvml_gpus() -> list[GPU] | None:
    """Every NVIDIA GPU NVML sees (possibly none); None when NVML cannot be used here."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # ImportError, NVMLError_LibraryNotFound, NVMLError_DriverNotLoaded, ...
        return None
    try:
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            memory = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total) // 2**20
            gpus.append(GPU("nvidia", _text(pynvml.nvmlDeviceGetName(handle)), memory, driver, "cuda"))
        return gpus
    except Exception:  # a GPU that fell off the bus, a driver mismatch: let nvidia-smi try
        return None
    finally:
        with contextlib.suppress(Exception):  # nothing to do about a failed shutdown
            pynvml.nvmlShutdown()
