"""The window's status bar, whose messages stop short of the fixed labels on its right.

Qt draws a message up to the first permanent widget and cuts it there, mid-word, so at 1000 px a long
message ran straight into "Server: …" and "Engine: …". Here it ends with "…" a gap before them and the
whole text is the tooltip. The message itself is unchanged (``currentMessage``), only how it is drawn.
"""

from __future__ import annotations

from PySide6.QtCore import QRect, Qt
from PySide6.QtGui import QPainter, QPaintEvent
from PySide6.QtWidgets import QStatusBar, QStyle, QStyleOption, QWidget

GAP = 24  # between the message and the first fixed label
INDENT = 6


class StatusBar(QStatusBar):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.permanent: list[QWidget] = []
        self.messageChanged.connect(lambda _text: self.update())

    def addPermanentWidget(self, widget: QWidget, stretch: int = 0) -> None:  # noqa: N802 (Qt's name)
        self.permanent.append(widget)
        super().addPermanentWidget(widget, stretch)

    def message_rect(self) -> QRect:
        """Where the message may be drawn: from the left edge to a gap before the first fixed label."""
        lefts = [w.x() for w in self.permanent if w.isVisible()]
        right = (min(lefts) if lefts else self.width()) - GAP
        return QRect(INDENT, 0, max(0, right - INDENT), self.height())

    def shown_message(self) -> str:
        """The message as drawn: whole, or cut with "…" where it would reach the fixed labels."""
        return self.fontMetrics().elidedText(self.currentMessage(), Qt.TextElideMode.ElideRight,
                                             self.message_rect().width())

    def paintEvent(self, event: QPaintEvent) -> None:  # noqa: N802 (Qt's name)
        text = self.currentMessage()
        if not text:
            self.setToolTip("")
            super().paintEvent(event)
            return
        painter = QPainter(self)
        option = QStyleOption()
        option.initFrom(self)
        self.style().drawPrimitive(QStyle.PrimitiveElement.PE_PanelStatusBar, option, painter, self)
        shown = self.shown_message()
        self.setToolTip(text if shown != text else "")
        painter.setPen(self.palette().windowText().color())
        painter.drawText(self.message_rect(), Qt.AlignmentFlag.AlignLeading | Qt.AlignmentFlag.AlignVCenter
                         | Qt.TextFlag.TextSingleLine, shown)
