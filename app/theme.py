"""Colours for light and dark themes; "system" follows the OS colour scheme.

:func:`apply_qt_palette` can be called again at any time (live theme
switching): it replaces the application palette and style sheet, and every
widget repaints. Two things the palette alone got wrong: a ``QPalette`` built
by setting roles for all colour groups makes disabled buttons look enabled,
so the Disabled group is set on its own; and a dark palette leaves input
boxes without a visible frame, so inputs get a border from the style sheet.
Likewise a dark palette leaves check boxes almost invisible (Fusion outlines
them in a shade darker than the window): in the dark theme they get a light
frame, and when checked the accent colour with a white tick.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

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
    border: str = "#c7cbd3"  # frames of input boxes
    disabled: str = "#9ca3af"  # text of disabled controls

    def code_palette(self) -> dict[str, str]:
        """What the Markdown renderer needs: the code block's colours and the Pygments style."""
        return {"code_bg": self.code_bg, "muted": self.muted,
                "pygments_style": "github-dark" if self.dark else "default"}


LIGHT = Palette(False, "#1d1f23", "#6b7280", "#2563eb", "#7c3aed", "#f3f4f6", "#fde68a", "#ffffff",
                "#16a34a", "#dc2626", border="#c7cbd3", disabled="#a3a8b3")
DARK = Palette(True, "#e5e7eb", "#9ca3af", "#60a5fa", "#c4b5fd", "#1f2430", "#6b5a1e", "#181b22",
               "#4ade80", "#f87171", border="#454b59", disabled="#5c6270")


CHECK_MARK = Path(__file__).resolve().parents[1] / "assets" / "icons" / "check.png"  # white, on the accent


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
    # frames and bevels (Fusion draws input and button borders from these)
    border = QColor(p.border)
    for role, color in ((QPalette.ColorRole.Light, border.lighter(130)), (QPalette.ColorRole.Midlight, border),
                        (QPalette.ColorRole.Mid, border), (QPalette.ColorRole.Dark, border.darker(130)),
                        (QPalette.ColorRole.Shadow, border.darker(160))):
        pal.setColor(role, color)
    disabled = QPalette.ColorGroup.Disabled
    for role in (QPalette.ColorRole.ButtonText, QPalette.ColorRole.Text, QPalette.ColorRole.WindowText):
        pal.setColor(disabled, role, QColor(p.disabled))
    pal.setColor(disabled, QPalette.ColorRole.Button, window)
    pal.setColor(disabled, QPalette.ColorRole.Base, window)
    pal.setColor(disabled, QPalette.ColorRole.Highlight, QColor(p.border))
    QGuiApplication.setPalette(pal)
    if hasattr(app, "setStyleSheet"):  # a QApplication (widgets), not a bare QGuiApplication
        app.setStyleSheet(style_sheet(p))


def style_sheet(p: Palette) -> str:
    """What the palette cannot say: visible frames on input boxes in both themes, and on check boxes in the
    dark one."""
    sheet = (f"QLineEdit, QPlainTextEdit {{ border:1px solid {p.border}; border-radius:4px; padding:3px; }}"
             f" QLineEdit:focus, QPlainTextEdit:focus {{ border-color:{p.accent}; }}"
             f" QLineEdit:disabled, QPlainTextEdit:disabled {{ color:{p.disabled}; }}")
    if p.dark:
        check = CHECK_MARK.as_posix()
        sheet += (f" QCheckBox::indicator, QGroupBox::indicator {{ width:13px; height:13px; border:1px solid {p.muted};"
                  f" border-radius:3px; background:{p.panel_bg}; }}"
                  f" QCheckBox::indicator:checked, QGroupBox::indicator:checked {{ background:{p.accent};"
                  f" border-color:{p.accent}; image:url({check}); }}"
                  f" QCheckBox::indicator:disabled {{ border-color:{p.disabled}; }}"
                  f" QCheckBox::indicator:checked:disabled {{ background:{p.disabled}; }}"
                  f" QCheckBox::indicator:focus {{ border-color:{p.accent}; }}")
    return sheet
