"""Before Qt starts: a system library Qt's X11 plugin needs and cannot do without.

Without ``libxcb-cursor0`` (Qt 6.5+ on X11) Qt aborts with "could not load the Qt platform plugin
'xcb'… Reinstalling the application may fix this problem", which sends users to reinstall the wrong
thing. The library is looked for the way Qt will (``dlopen`` by its soname) and, when it is missing, the
app says which package to install and exits instead. Wayland sessions, other platforms (offscreen, a
frozen build's own choice) and other systems are not checked.
"""

from __future__ import annotations

import ctypes
import os
import sys

XCB_CURSOR = "libxcb-cursor.so.0"
MISSING = ("MTP Studio cannot open its window: the system library {lib} is missing (Qt needs it on X11).\n"
           "Install it and start MTP Studio again:\n"
           "  Debian, Ubuntu, Mint:  sudo apt install libxcb-cursor0\n"
           "  Fedora, RHEL:          sudo dnf install xcb-util-cursor\n"
           "  Arch:                  sudo pacman -S xcb-util-cursor\n"
           "  openSUSE:              sudo zypper install libxcb-cursor0")


def uses_xcb(env: dict[str, str] | os._Environ[str], platform: str = sys.platform) -> bool:
    """Whether Qt will pick its X11 (xcb) plugin here."""
    if not platform.startswith("linux"):
        return False
    chosen = env.get("QT_QPA_PLATFORM", "")
    if chosen:
        return chosen.split(";")[0].split(":")[0] == "xcb"
    return env.get("XDG_SESSION_TYPE") != "wayland" or not env.get("WAYLAND_DISPLAY")


def missing_library(env: dict[str, str] | os._Environ[str] = os.environ, platform: str = sys.platform) -> str:
    """What to tell the user before Qt starts ("" when nothing is missing)."""
    if not uses_xcb(env, platform):
        return ""
    try:
        ctypes.CDLL(XCB_CURSOR)
    except OSError:
        return MISSING.format(lib=XCB_CURSOR)
    return ""
