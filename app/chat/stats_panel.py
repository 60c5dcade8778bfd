"""Live speculative statistics beside the chat: first what MTP gains (the
speedup where it was measured), then tok/s over time, acceptance, acceptance
per draft position, mean accepted length, and where the time goes. While
the prompt is read, "Processing prompt (N tokens)…" with a bar.

Painted by hand (QPainter) so it needs nothing beyond PySide6-Essentials and
costs little per update. Long lines wrap at the panel's width, and the panel is
as tall as what it drew (``content_height``): in a window 700 px high a reply
with eight draft positions runs past the bottom, so the panel sits in a
vertical scroll area (:func:`scrolled`) instead of being cut. Every MTP term drawn has a tooltip in plain words
(``stats_text.GLOSSARY``): the painter notes where it drew each term.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, QPointF, QRectF, QSize, Qt
from PySide6.QtGui import QColor, QFont, QHelpEvent, QPainter, QPen
from PySide6.QtWidgets import QFrame, QScrollArea, QToolTip, QWidget

from app.theme import Palette
from engine.speculative import stats_text
from engine.speculative.stats import StatsSnapshot

PHASE_COLORS = {"prefill": "#a78bfa", "draft": "#f59e0b", "verify": "#3b82f6", "catch_up": "#14b8a6",
                "rollback": "#ef4444", "sampling": "#ec4899", "other": "#9ca3af"}


class StatsPanel(QWidget):
    def __init__(self, palette: Palette, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.palette_ = palette
        self.stats: StatsSnapshot | None = None
        self.history: list[float] = []  # decode tok/s at each update
        self.final = False
        self.speedup: float | None = None  # measured MTP speedup for this reply's settings
        self.speedup_source = ""
        self.speedup_sampling: tuple[str | None, str | None] = (None, None)  # measured with, this reply's
        self.prefill: tuple[int, int] | None = None  # prompt tokens read, of how many
        self.tips: list[tuple[QRectF, str]] = []  # where each explained term was drawn
        self.content_height = 0  # how far down the last paint drew
        self.setMinimumWidth(250)

    def sizeHint(self) -> QSize:
        return QSize(280, 520)

    def reset(self) -> None:
        """Show nothing: a new reply starts, another chat opens, or another model loaded."""
        self.stats = None
        self.history = []
        self.final = False
        self.speedup = None
        self.prefill = None
        self.update()

    def show_last(self, messages: list) -> None:
        """The statistics of the newest reply among ``messages`` (ShownMessage) that has any; none: nothing."""
        last = next((m.stats for m in reversed(messages) if m.stats), None)
        self.reset()
        if last:
            self.update_stats(last, final=True)

    def set_speedup(self, speedup: float | None, source: str = "autotuned", *, measured_with: str | None = None,
                    sampling: str | None = None) -> None:
        """The measured speedup of the settings this reply uses (None: not measured), and the sampling it was
        measured with and this reply's (keys of engine.sampling.sampling_key): shown only where they match."""
        self.speedup, self.speedup_source = speedup, source
        self.speedup_sampling = (measured_with, sampling)
        self.update()

    def show_prefill(self, done: int, total: int) -> None:
        self.prefill = (done, total)
        self.update()

    def headline(self) -> str:
        """The first line: what MTP gains, or prompt progress before there are figures."""
        if self.stats is None:
            return stats_text.prefill_progress(*self.prefill) if self.prefill else ""
        measured_with, sampling = self.speedup_sampling
        return stats_text.headline(self.stats, self.speedup, self.speedup_source, measured_with=measured_with,
                                   sampling=sampling)

    def update_stats(self, stats: StatsSnapshot, final: bool = False) -> None:
        self.stats = stats
        self.final = final
        self.prefill = None
        tps = stats.decode_tps
        if tps and not final:
            self.history.append(float(tps))
            self.history = self.history[-120:]
        self.update()

    def event(self, event: QEvent) -> bool:
        if event.type() == QEvent.Type.ToolTip and isinstance(event, QHelpEvent):
            # QHelpEvent has pos() only (no position(), unlike mouse events)
            where = QPointF(event.pos())
            tip = next((text for rect, text in self.tips if rect.contains(where)), "")
            if tip:
                QToolTip.showText(event.globalPos(), tip, self)
            else:
                QToolTip.hideText()
                event.ignore()
            return True
        return super().event(event)

    def _tip(self, x: float, y: float, w: float, h: float, term: str) -> None:
        text = stats_text.GLOSSARY.get(term)
        if text:
            self.tips.append((QRectF(x, y, w, h), f"<b>{term}</b>: {text}"))

    # -- painting ---------------------------------------------------------------
    def paintEvent(self, _event: object) -> None:
        bottom = self._paint()
        if bottom != self.content_height:  # taller or shorter: the scroll area follows
            self.content_height = bottom
            self.setMinimumHeight(bottom)

    def _paint(self) -> int:
        """Draw everything; return the bottom of what was drawn (with a margin)."""
        p = self.palette_
        qp = QPainter(self)
        qp.setRenderHint(QPainter.RenderHint.Antialiasing)
        qp.fillRect(self.rect(), QColor(p.panel_bg))
        w = self.width() - 32
        x, y = 16, 18
        s = self.stats
        title = QFont(self.font())
        title.setBold(True)
        qp.setFont(title)
        qp.setPen(QColor(p.text))
        qp.drawText(x, y + 4, "Live statistics" if not self.final else "Last reply")
        y += 22
        self.tips = []
        if s is None:
            qp.setFont(self.font())
            if self.prefill is not None:
                self._prefill_bar(qp, x, y, w)
                return y + 56
            qp.setPen(QColor(p.muted))
            qp.drawText(QRectF(x, y, w, 60), Qt.TextFlag.TextWordWrap,
                        "Statistics appear here while a reply streams.")
            return y + 76
        qp.setFont(title)
        qp.setPen(QColor(p.accent if s.speculative else p.muted))
        line = self.headline()
        rect = qp.boundingRect(QRectF(x, y, w, 200), Qt.TextFlag.TextWordWrap, line)  # a narrow panel wraps it
        qp.drawText(rect, Qt.TextFlag.TextWordWrap, line)
        self._tip(x, y, w, rect.height(), "speedup" if self.speedup else "mean accepted length" if s.rounds
                  else "draft depth")
        y += int(rect.height()) + 6
        big = QFont(self.font())
        big.setPointSizeF(self.font().pointSizeF() * 2.2)
        big.setBold(True)
        qp.setFont(big)
        qp.setPen(QColor(p.accent))
        tps = s.decode_tps
        qp.drawText(x, y + 30, f"{tps:.1f}" if tps else "–")
        qp.setFont(self.font())
        qp.setPen(QColor(p.muted))
        qp.drawText(x + 110, y + 30, "tok/s decode")
        y += 44
        e2e = s.end_to_end_tps
        line = f"end-to-end {e2e:.1f} tok/s · {s.generated_tokens} tokens" if e2e else f"{s.generated_tokens} tokens"
        y += int(max(20.0, self._wrapped(qp, x, y, w, line) + 2))  # a narrow panel wraps it too
        y = self._sparkline(qp, x, y, w, 48)

        y += 10
        y = self._section(qp, x, y, "Speculative decoding")
        y = self._lines(qp, x, y, stats_text.panel_items(s), w)
        if s.rounds:
            y = self._position_bars(qp, x, y, w, s)

        y += 8
        y = self._section(qp, x, y, "Where the time goes")
        return self._time_split(qp, x, y, w, s) + 12

    def _section(self, qp: QPainter, x: int, y: int, text: str) -> int:
        f = QFont(self.font())
        f.setBold(True)
        qp.setFont(f)
        qp.setPen(QColor(self.palette_.text))
        qp.drawText(x, y + 12, text)
        qp.setFont(self.font())
        return y + 20

    def _wrapped(self, qp: QPainter, x: float, y: float, w: float, line: str) -> float:
        """Draw ``line`` in rows of 18 px, wrapped at the panel's width (a narrow
        panel or a long line, "draft depth 2 now (adaptive, up to 8), rollback:
        checkpoint", would otherwise be cut at the edge); return its height."""
        flags = Qt.TextFlag.TextWordWrap | Qt.AlignmentFlag.AlignVCenter
        rows = max(1, round(qp.boundingRect(QRectF(x, y, w, 1000), Qt.TextFlag.TextWordWrap, line).height()
                            / qp.fontMetrics().lineSpacing()))
        height = 18.0 * rows
        qp.drawText(QRectF(x, y, w, height), flags, line)
        return height

    def _lines(self, qp: QPainter, x: int, y: int, items: list[tuple[str, str]], w: int) -> int:
        qp.setPen(QColor(self.palette_.muted))
        for line, term in items:
            height = self._wrapped(qp, x, y, w, line)
            self._tip(x, y, w, height, term)
            if term == "rollback":  # the line names the draft depth first
                depth = min(w, qp.fontMetrics().horizontalAdvance(line.split(",")[0]))
                self._tip(x, y, depth, 18, "draft depth")
                self.tips.insert(0, self.tips.pop())  # the narrower rect is found first
            y += int(height)
        return y

    def _prefill_bar(self, qp: QPainter, x: int, y: int, w: int) -> None:
        """Prompt progress: the words, then a bar of the tokens read so far."""
        p = self.palette_
        done, total = self.prefill or (0, 0)
        qp.setPen(QColor(p.text))
        qp.drawText(QRectF(x, y, w, 20), Qt.TextFlag.TextSingleLine, stats_text.prefill_progress(done, total))
        self._tip(x, y, w, 20, "prefill")
        bar = QRectF(x, y + 26, w, 10)
        qp.fillRect(bar, QColor(p.code_bg))
        qp.fillRect(QRectF(bar.x(), bar.y(), bar.width() * (done / total if total else 0), bar.height()),
                    QColor(p.accent))

    def _sparkline(self, qp: QPainter, x: int, y: int, w: int, h: int) -> int:
        p = self.palette_
        qp.setPen(QPen(QColor(p.code_bg), 1))
        qp.drawRect(QRectF(x, y, w, h))
        pts = self.history
        if len(pts) >= 2:
            top = max(pts) * 1.1 or 1.0
            step = w / (len(pts) - 1)
            qp.setPen(QPen(QColor(p.accent), 2))
            for i in range(1, len(pts)):
                qp.drawLine(int(x + (i - 1) * step), int(y + h - pts[i - 1] / top * h),
                            int(x + i * step), int(y + h - pts[i] / top * h))
        return y + h + 4

    def _position_bars(self, qp: QPainter, x: int, y: int, w: int, s: StatsSnapshot) -> int:
        p = self.palette_
        self._tip(x, y, w, 18 * len(s.acceptance_per_pos), "acceptance per position")
        for i, frac in enumerate(s.acceptance_per_pos):
            qp.setPen(QColor(p.muted))
            qp.drawText(x, y + 12, f"pos {i + 1}")
            bar = QRectF(x + 50, y + 2, w - 100, 12)
            qp.fillRect(bar, QColor(p.code_bg))
            qp.fillRect(QRectF(bar.x(), bar.y(), bar.width() * frac, bar.height()), QColor(p.good))
            qp.drawText(int(bar.right() + 6), y + 12, f"{100 * frac:.0f}%")
            y += 18
        return y

    def _time_split(self, qp: QPainter, x: int, y: int, w: int, s: StatsSnapshot) -> int:
        phases = s.phase_seconds
        total = sum(phases.values()) or 1.0
        cx = float(x)
        for name, secs in phases.items():
            width = w * secs / total
            qp.fillRect(QRectF(cx, y, width, 14), QColor(PHASE_COLORS.get(name, "#888")))
            cx += width
        y += 22
        qp.setFont(self.font())
        for name, secs in phases.items():
            if secs <= 0:
                continue
            label = stats_text.phase_label(s, name)
            qp.fillRect(QRectF(x, y + 4, 10, 10), QColor(PHASE_COLORS.get(name, "#888")))
            qp.setPen(QColor(self.palette_.muted))
            height = self._wrapped(qp, x + 16, y, w - 16, f"{label}  {1000 * secs:.0f} ms ({100 * secs / total:.0f}%)")
            self._tip(x, y, w, height, label)
            y += int(height)
        return y


def scrolled(panel: StatsPanel) -> QScrollArea:
    """``panel`` in a frameless scroll area that scrolls up and down only: a short
    window shows the top and a scroll bar rather than cutting the bottom off."""
    area = QScrollArea()
    area.setFrameShape(QFrame.Shape.NoFrame)
    area.setWidgetResizable(True)
    area.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
    area.setWidget(panel)
    # never narrower than the panel plus a scroll bar (the splitter would otherwise cut its right edge)
    area.setMinimumWidth(panel.minimumWidth() + area.verticalScrollBar().sizeHint().width())
    return area
