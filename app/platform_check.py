"""Before Qt starts: the system libraries Qt's X11 plugin needs and cannot do without.

Without ``libxcb-cursor0`` (Qt 6.5+ on X11) Qt aborts with "could not load the Qt platform plugin
'xcb'… Reinstalling the application may fix this problem", which sends users to reinstall the wrong
thing; so does a missing libxcb-icccm4 or libxkbcommon-x11-0. Each library is looked for the way Qt will
(``dlopen`` by its soname) and, when any is missing, the app names the packages to install and exits instead.
Wayland sessions, other platforms (offscreen, a frozen build's own choice) and other systems are not checked.
"""

from __future__ import annotations

import ctypes
import os
import sys

XCB_CURSOR = "libxcb-cursor.so.0"
# Every library Qt's xcb plugin links to that a minimal system (a server image, WSL, a container) may lack,
# with its package on Debian/Ubuntu, Fedora/RHEL, Arch and openSUSE. With libxcb-cursor0 present and, say,
# libxcb-icccm4 missing, Qt still says "xcb-cursor0 is needed" and "reinstall": seen under Xvfb on a fresh
# Debian while writing scripts/walkthrough.py.
XCB_LIBRARIES: dict[str, tuple[str, str, str, str]] = {
    XCB_CURSOR: ("libxcb-cursor0", "xcb-util-cursor", "xcb-util-cursor", "libxcb-cursor0"),
    "libxcb-icccm.so.4": ("libxcb-icccm4", "xcb-util-wm", "xcb-util-wm", "libxcb-icccm4"),
    "libxcb-image.so.0": ("libxcb-image0", "xcb-util-image", "xcb-util-image", "libxcb-image0"),
    "libxcb-keysyms.so.1": ("libxcb-keysyms1", "xcb-util-keysyms", "xcb-util-keysyms", "libxcb-keysyms1"),
    "libxcb-render-util.so.0": ("libxcb-render-util0", "xcb-util-renderutil", "xcb-util-renderutil",
                                "libxcb-render-util0"),
    "libxcb-util.so.1": ("libxcb-util1", "xcb-util", "xcb-util", "libxcb-util1"),
    "libxcb-randr.so.0": ("libxcb-randr0", "libxcb", "libxcb", "libxcb-randr0"),
    "libxcb-shape.so.0": ("libxcb-shape0", "libxcb", "libxcb", "libxcb-shape0"),
    "libxcb-xkb.so.1": ("libxcb-xkb1", "libxcb", "libxcb", "libxcb-xkb1"),
    "libxkbcommon-x11.so.0": ("libxkbcommon-x11-0", "libxkbcommon-x11", "libxkbcommon-x11", "libxkbcommon-x11-0"),
}
MISSING = ("MTP Studio cannot open its window: the system {what} missing (Qt needs {it} on X11).\n"
           "Install {it} and start MTP Studio again:\n"
           "  Debian, Ubuntu, Mint:  sudo apt install {apt}\n"
           "  Fedora, RHEL:          sudo dnf install {dnf}\n"
           "  Arch:                  sudo pacman -S {pacman}\n"
           "  openSUSE:              sudo zypper install {zypper}")


def missing_message(libs: list[str]) -> str:
    """What to say for these missing libraries: each named, and the packages to install on each system."""
    what = f"library {libs[0]} is" if len(libs) == 1 else f"libraries {', '.join(libs)} are"
    packages = [" ".join(dict.fromkeys(XCB_LIBRARIES[lib][i] for lib in libs)) for i in range(4)]
    return MISSING.format(what=what, it="it" if len(libs) == 1 else "them", apt=packages[0], dnf=packages[1],
                          pacman=packages[2], zypper=packages[3])


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
    missing = []
    for lib in XCB_LIBRARIES:
        try:
            ctypes.CDLL(lib)
        except OSError:
            missing.append(lib)
    return missing_message(missing) if missing else ""
