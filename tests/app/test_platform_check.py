"""Without libxcb-cursor0 on X11 the app names the package to install instead of Qt's "reinstall" abort."""

from __future__ import annotations

import ctypes

from app import main, platform_check


def no_xcb_cursor(monkeypatch) -> None:
    """libxcb-cursor missing and every other X11 library Qt needs present, whatever this machine has (a
    fresh Debian lacks several: the message would then name them all)."""
    real = ctypes.CDLL

    def cdll(name, *a, **kw):
        if name == platform_check.XCB_CURSOR:
            raise OSError(f"{name}: cannot open shared object file: No such file or directory")
        if name in platform_check.XCB_LIBRARIES:
            return object()
        return real(name, *a, **kw)

    monkeypatch.setattr(ctypes, "CDLL", cdll)


def test_a_missing_xcb_cursor_names_the_package_and_exits_before_qt(monkeypatch, capsys):
    no_xcb_cursor(monkeypatch)
    monkeypatch.setenv("QT_QPA_PLATFORM", "xcb")
    started: list[object] = []
    monkeypatch.setattr("app.application.run", lambda *a, **kw: started.append(a) or 0)
    assert main.main(["--gui"]) == 1
    err = capsys.readouterr().err
    assert "libxcb-cursor.so.0 is missing" in err and "sudo apt install libxcb-cursor0" in err
    assert started == []


def test_only_x11_is_checked():
    env = {"QT_QPA_PLATFORM": "offscreen"}
    assert not platform_check.uses_xcb(env, "linux")
    assert not platform_check.uses_xcb({"XDG_SESSION_TYPE": "wayland", "WAYLAND_DISPLAY": "wayland-0"}, "linux")
    assert platform_check.uses_xcb({"DISPLAY": ":0"}, "linux")
    assert platform_check.uses_xcb({"QT_QPA_PLATFORM": "xcb:nograb"}, "linux")
    assert not platform_check.uses_xcb({"DISPLAY": ":0"}, "win32")
    assert platform_check.missing_library({"QT_QPA_PLATFORM": "offscreen"}, "linux") == ""


def test_with_the_library_present_nothing_is_said(monkeypatch):
    monkeypatch.setattr(ctypes, "CDLL", lambda name, *a, **kw: object())
    assert platform_check.missing_library({"DISPLAY": ":0"}, "linux") == ""


def test_every_missing_xcb_library_is_named_with_its_packages(monkeypatch, capsys):
    """libxcb-cursor0 present, libxcb-icccm4 and libxkbcommon-x11-0 missing (a fresh Debian under Xvfb): Qt
    still blames xcb-cursor0; the app names the two that are missing and what to install."""
    gone = {"libxcb-icccm.so.4", "libxkbcommon-x11.so.0"}

    def cdll(name, *a, **kw):
        if name in gone:
            raise OSError(f"{name}: cannot open shared object file: No such file or directory")
        return object()

    monkeypatch.setattr(ctypes, "CDLL", cdll)
    said = platform_check.missing_library({"DISPLAY": ":0"}, "linux")
    assert "libraries libxcb-icccm.so.4, libxkbcommon-x11.so.0 are missing" in said
    assert "sudo apt install libxcb-icccm4 libxkbcommon-x11-0" in said
    assert "sudo dnf install xcb-util-wm libxkbcommon-x11" in said
    assert platform_check.XCB_CURSOR not in said
