"""Colours for light and dark themes; "system" follows the OS colour scheme."""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QGuiApplication, QPalette


@dataclass(frozen=True)
class Palette:
    dark: bool
    text: str
    muted: str
    accent: str
    user: str
    code_bg: str
    draft_bg: str
    panel_bg: str
    good: str
    bad: str

    def code_palette(self) -> dict[str, str]:
        if self.dark:
            return {"code_bg": self.code_bg, "muted": self.muted, "comment": "#7f8c98",
                    "string": "#a5d6a7", "keyword": "#82aaff", "number": "#f78c6c"}
        return {"code_bg": self.code_bg, "muted": self.muted, "comment": "#6a737d",
                "string": "#22863a", "keyword": "#005cc5", "number": "#b35900"}


LIGHT = Palette(False, "#1d1f23", "#6b7280", "#2563eb", "#7c3aed", "#f3f4f6", "#fde68a", "#ffffff",
                "#16a34a", "#dc2626")
DARK = Palette(True, "#e5e7eb", "#9ca3af", "#60a5fa", "#c4b5fd", "#1f2430", "#6b5a1e", "#181b22",
               "#4ade80", "#f87171")


def system_is_dark() -> bool:
    hints = QGuiApplication.styleHints()
    scheme = hints.colorScheme() if hasattr(hints, "colorScheme") else Qt.ColorScheme.Unknown
    if scheme == Qt.ColorScheme.Dark:
        return True
    if scheme == Qt.ColorScheme.Light:
        return False
    return QGuiApplication.palette().color(QPalette.ColorRole.Window).lightness() < 128


def palette_for(theme: str) -> Palette:
    dark = system_is_dark() if theme == "system" else theme == "dark"
    return DARK if dark else LIGHT


def apply_qt_palette(p: Palette) -> None:
    """Set the application palette so native widgets match the chosen theme."""
    app = QGuiApplication.instance()
    if app is None:
        return
    pal = QPalette()
    window = QColor("#14161b" if p.dark else "#f7f7f9")
    base = QColor(p.panel_bg)
    text = QColor(p.text)
    pal.setColor(QPalette.ColorRole.Window, window)
    pal.setColor(QPalette.ColorRole.Base, base)
    pal.setColor(QPalette.ColorRole.AlternateBase, QColor(p.code_bg))
    pal.setColor(QPalette.ColorRole.WindowText, text)
    pal.setColor(QPalette.ColorRole.Text, text)
    pal.setColor(QPalette.ColorRole.Button, QColor("#232733" if p.dark else "#eceef2"))
    pal.setColor(QPalette.ColorRole.ButtonText, text)
    pal.setColor(QPalette.ColorRole.Highlight, QColor(p.accent))
    pal.setColor(QPalette.ColorRole.HighlightedText, QColor("#ffffff"))
    pal.setColor(QPalette.ColorRole.PlaceholderText, QColor(p.muted))
    pal.setColor(QPalette.ColorRole.ToolTipBase, base)
    pal.setColor(QPalette.ColorRole.ToolTipText, text)
    QGuiApplication.setPalette(pal)
