"""The autotune wizard's live chart: each setting's speed relative to no speculation, as a bar."""

from __future__ import annotations

from PySide6.QtCore import QRectF, Qt
from PySide6.QtGui import QColor, QPainter
from PySide6.QtWidgets import QWidget

from app.theme import Palette


class SpeedChart(QWidget):
    """Bars of speed relative to "off", one per setting, updated live.

    The label column is as wide as the longest label (at most half the
    chart): a fixed one cut "p_min=0.5" to "p_min=0", which read as another
    setting. A label still too long for half the chart is elided in the
    middle, keeping the mode and the gate readable.
    """

    LABEL_PAD = 8  # between a label and its bar
    VALUE_W = 60  # the "1.23x" after each bar

    def __init__(self, palette: Palette, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.palette_ = palette
        self.ratios: dict[str, float] = {}
        self.setMinimumHeight(200)

    def set_ratio(self, label: str, ratio: float) -> None:
        self.ratios[label] = ratio
        self.update()

    def label_width(self) -> int:
        """The label column: the longest label and its padding, at most half the chart."""
        longest = max((self.fontMetrics().horizontalAdvance(label) for label in self.ratios), default=0)
        return min(longest + 4 + self.LABEL_PAD + 2, max(80, self.width() // 2))

    def paintEvent(self, _event: object) -> None:
        p = self.palette_
        qp = QPainter(self)
        qp.fillRect(self.rect(), QColor(p.panel_bg))
        if not self.ratios:
            qp.setPen(QColor(p.muted))
            qp.drawText(self.rect(), Qt.AlignmentFlag.AlignCenter, "Speed by setting appears here")
            return
        items = sorted(self.ratios.items())
        top = max(1.2, max(self.ratios.values()) * 1.1)
        row_h = min(24.0, (self.height() - 10) / len(items))
        label_w = self.label_width()
        width = self.width() - label_w - self.VALUE_W
        one = label_w + width / top
        metrics = qp.fontMetrics()
        for i, (label, ratio) in enumerate(items):
            y = 5 + i * row_h
            qp.setPen(QColor(p.text))
            shown = metrics.elidedText(label, Qt.TextElideMode.ElideMiddle, label_w - 4 - self.LABEL_PAD)
            qp.drawText(QRectF(4, y, label_w - 4 - self.LABEL_PAD, row_h), Qt.AlignmentFlag.AlignVCenter, shown)
            color = p.good if ratio >= 1.0 else p.bad
            qp.fillRect(QRectF(label_w, y + 3, width * ratio / top, row_h - 6), QColor(color))
            qp.drawText(QRectF(label_w + width * ratio / top + 4, y, 60, row_h), Qt.AlignmentFlag.AlignVCenter,
                        f"{ratio:.2f}x")
        qp.setPen(QColor(p.muted))
        qp.drawLine(int(one), 0, int(one), self.height())
