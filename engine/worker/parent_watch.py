"""The worker ends with the process that started it, on every OS.

An orphaned worker keeps a whole model in memory, and the next app start
loads a second copy. Three guards, from the quickest to the most general:

- Linux: ``PR_SET_PDEATHSIG`` asks the kernel to SIGKILL the worker the moment
  its parent ends, however it ends (SIGKILL included), whatever the worker
  is doing (a decode blocked in native code too). The kernel's "parent" is
  the *thread* that started the worker: start workers from a thread that
  lives as long as they should (the app's GUI thread, the server's reader).
- Elsewhere, and as a fallback: :func:`parent_gone` polled by a watchdog
  thread (POSIX: the parent id changed, the worker was re-parented; Windows,
  which never re-parents: the parent's process handle is signalled).
- Everywhere: stdin closing (the app's end of the pipe went with it).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def arm_death_signal() -> bool:
    """Ask the kernel for SIGKILL when the parent ends (Linux); whether that was set."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)) == 0
    except (OSError, AttributeError):  # no prctl in this libc (musl has it; be safe anyway)
        return False


def parent_gone() -> Callable[[], bool]:
    """A check, cheap enough to poll every second, that is True once the parent of now has ended."""
    parent = os.getppid()
    if sys.platform == "win32":
        return _windows_parent_gone(parent)
    return lambda: os.getppid() != parent


def _windows_parent_gone(parent: int) -> Callable[[], bool]:
    """Windows keeps the parent id of a dead parent (and may reuse it): hold a handle to the parent,
    opened now, and ask whether it is signalled (the process ended)."""
    synchronize, wait_object_0 = 0x00100000, 0
    kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)  # type: ignore[attr-defined]
    handle = kernel32.OpenProcess(synchronize, False, parent)
    if not handle:  # 87, ERROR_INVALID_PARAMETER: no such process (already gone); else not ours to watch
        gone = ctypes.get_last_error() == 87  # type: ignore[attr-defined]
        return lambda: gone
    return lambda: int(kernel32.WaitForSingleObject(handle, 0)) == wait_object_0
