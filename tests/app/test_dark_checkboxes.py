"""Check boxes are visible in the dark theme: the unchecked box's frame stands out from the window (it was
a shade darker than the window, ~1.1:1), and a checked box shows the accent with a light tick."""

from __future__ import annotations

from PySide6.QtGui import QColor
from PySide6.QtWidgets import QCheckBox, QStyle, QStyleOptionButton

from app.theme import DARK, LIGHT, apply_qt_palette


def luminance(c: QColor) -> float:
    def channel(v: float) -> float:
        return v / 12.92 if v <= 0.03928 else ((v + 0.055) / 1.055) ** 2.4
    return 0.2126 * channel(c.redF()) + 0.7152 * channel(c.greenF()) + 0.0722 * channel(c.blueF())


def contrast(a: QColor, b: QColor) -> float:
    hi, lo = sorted((luminance(a), luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def indicator_pixels(box: QCheckBox) -> list[QColor]:
    opt = QStyleOptionButton()
    box.initStyleOption(opt)
    rect = box.style().subElementRect(QStyle.SubElement.SE_CheckBoxIndicator, opt, box)
    image = box.grab().toImage()
    ratio = image.devicePixelRatio()
    return [image.pixelColor(int(x * ratio), int(y * ratio))
            for x in range(rect.left(), rect.right() + 1) for y in range(rect.top(), rect.bottom() + 1)]


def test_dark_check_boxes_stand_out_from_the_window(qtbot):
    apply_qt_palette(DARK)
    try:
        off, on = QCheckBox("Has MTP"), QCheckBox("Has MTP")
        on.setChecked(True)
        for box in (off, on):
            qtbot.addWidget(box)
            box.resize(120, 24)
        window = off.palette().window().color()
        frame = max(contrast(c, window) for c in indicator_pixels(off))
        assert frame >= 3.0, f"the unchecked box's frame has {frame:.2f}:1 against the window"
        checked = indicator_pixels(on)
        assert any(c.name() == QColor(DARK.accent).name() for c in checked)  # filled with the accent
        assert max(contrast(c, QColor(DARK.accent)) for c in checked) >= 2.0  # and a tick on it
    finally:
        apply_qt_palette(LIGHT)
