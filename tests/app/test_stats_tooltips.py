"""The statistics panel explains itself: hovering any of its figures shows
the glossary entry for it, and no line is cut at the panel's edge. Against
the real worker on a synthetic hybrid MTP model, so the panel shows every
section (draft depth, rollback, per-position bars, draft sources, phases)."""

from __future__ import annotations

from PySide6.QtCore import QEvent, QPoint
from PySide6.QtGui import QColor, QHelpEvent
from PySide6.QtWidgets import QApplication, QToolTip

from engine.speculative import stats_text
from engine.speculative.settings import mtp
from tests.app.conftest import reply_with_stats, start_and_load
from tests.engine.conftest import synth


def hover(panel, x: int, y: int) -> str:
    """Send the panel the tooltip event a resting mouse makes; the tooltip's text after it."""
    event = QHelpEvent(QEvent.Type.ToolTip, QPoint(x, y), panel.mapToGlobal(QPoint(x, y)))
    QApplication.sendEvent(panel, event)
    return QToolTip.text() if QToolTip.isVisible() else ""


def adaptive_reply(qtbot, services):
    """A finished adaptive MTP reply on a hybrid model (rollback by recurrent snapshots): the longest lines."""
    services.settings.model_path = str(synth("qwen35", "oracle", agree=0.7).path())
    services.settings.speculative = "auto"
    services.settings.max_tokens = 120
    start_and_load(qtbot, services)
    services.window.chat.profile_speculative = mtp(6, depth="adaptive")
    _live, finals = reply_with_stats(qtbot, services)
    final = finals[-1]
    assert final.rounds > 0 and final.settings.adaptive, final.settings
    return final


def test_hovering_every_figure_shows_its_explanation(qtbot, services):
    final = adaptive_reply(qtbot, services)
    panel = services.window.stats_panel
    panel.grab()  # painted: the panel knows where it drew each term
    seen: set[str] = set()
    for y in range(2, panel.height(), 3):
        for x in (24, panel.width() // 2):
            text = hover(panel, x, y)
            if text:
                seen.add(text)
    terms = ["draft depth", "rollback", "acceptance", "mean accepted length", "rounds", "acceptance per position",
             "mean accepted length" if not panel.speedup else "speedup"]
    terms += [stats_text.phase_label(final, name) for name, secs in final.phase_seconds.items() if secs > 0]
    if final.drafted_by_source:
        terms.append("draft source")
    for term in terms:
        if term not in stats_text.GLOSSARY:
            continue  # a phase with no entry ("rollback" has one, as the strategy's name)
        assert f"<b>{term}</b>: {stats_text.GLOSSARY[term]}" in seen, (term, sorted(seen))
    QToolTip.hideText()


def test_no_line_runs_past_the_panels_edge_at_its_narrowest(qtbot, services):
    adaptive_reply(qtbot, services)
    window = services.window
    panel = window.stats_panel
    # the panel as narrow as the splitter lets it be: every pixel in its right margin is background
    window.resize(1000, 700)
    sizes = window.splitter.sizes()
    window.splitter.setCollapsible(2, False)
    window.splitter.setSizes([sizes[0], sizes[1] + sizes[2] - 1, 1])
    qtbot.waitUntil(lambda: panel.width() <= panel.minimumWidth() + 20)
    line = stats_text.panel_lines(panel.stats)[0]
    assert panel.fontMetrics().horizontalAdvance(line) > panel.width() - 32, "a line too long for one row"
    image = panel.grab().toImage()
    background = QColor(window.palette_.panel_bg).rgb()
    ratio = image.devicePixelRatio()
    inked = [(x, y) for x in range(int((panel.width() - 12) * ratio), image.width())
             for y in range(image.height()) if image.pixel(x, y) != background]
    assert not inked, f"text drawn into the right margin at {inked[:5]} (cut off at the edge)"
