"""The packaged (frozen) app is one executable that is also every child process.

A source checkout starts its children with the interpreter: the worker as
``python -m engine.worker``, the JSON tools as ``python -m engine ...``, the
hardware and memory probes as ``python -c CODE``. A frozen app has no
interpreter, and ``sys.executable`` is the app itself. So the frozen
executable accepts those two forms of the interpreter's command line and
runs them the way Python would. Every call site keeps ``sys.executable`` and
its arguments unchanged: the handshake, crash reporting and restart are the
same code in both, with nothing to keep in step.

Only this application's own modules may be run with ``-m``; anything else is
refused with a message, so the packaged app is no general-purpose Python.
"""

from __future__ import annotations

import runpy
import sys
from collections.abc import Sequence

RUNNABLE_PACKAGES = ("engine", "app")


def is_frozen() -> bool:
    """True in a PyInstaller build (``sys.frozen`` is set by its bootloader)."""
    return bool(getattr(sys, "frozen", False))


def run_interpreter_args(args: Sequence[str]) -> int | None:
    """Run ``-m MODULE ...`` or ``-c CODE ...`` as Python would; None for any other command line.

    Returns the exit status; ``sys.exit`` inside the module or code propagates
    as ``SystemExit``, as it would from the interpreter.
    """
    if len(args) < 2 or args[0] not in ("-m", "-c"):
        return None
    flag, target, rest = args[0], args[1], list(args[2:])
    if flag == "-m":
        if target.split(".")[0] not in RUNNABLE_PACKAGES:
            print(f"mtp-studio: -m runs only this application's modules ({', '.join(RUNNABLE_PACKAGES)}), "
                  f"not {target!r}", file=sys.stderr)
            return 2
        sys.argv = [target, *rest]
        runpy.run_module(target, run_name="__main__", alter_sys=True)
        return 0
    sys.argv = ["-c", *rest]
    exec(compile(target, "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
    return 0
