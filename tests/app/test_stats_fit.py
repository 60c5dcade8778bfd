"""The statistics panel shows every line whole at 1000×700 and 1920×1080: lines
wrap at its width (nothing drawn into the right margin, where "…rollback" was
cut), and a reply with eight draft positions, taller than a 700 px window, is
scrolled to rather than cut at the bottom. Against the real worker on a
synthetic MTP model drafting eight tokens a round."""

from __future__ import annotations

import pytest
from PySide6.QtGui import QColor

from app.chat.stats_panel import PHASE_COLORS
from engine.speculative.settings import mtp
from tests.app.conftest import reply_with_stats, start_and_load
from tests.engine.conftest import synth


def colour_rows(image, colour: QColor) -> list[int]:
    """The rows of ``image`` where ``colour`` is painted in the legend's column (x 16..26)."""
    ratio = image.devicePixelRatio()
    return [y for y in range(image.height())
            if any(image.pixelColor(int(x * ratio), y).rgb() == colour.rgb() for x in range(17, 25))]


@pytest.mark.parametrize("size", ((1000, 700), (1920, 1080)))
def test_every_statistics_line_is_whole_at_both_sizes(qtbot, services, size):
    services.settings.model_path = str(synth("qwen35", "oracle", agree=0.95).path())
    services.settings.max_tokens = 120
    start_and_load(qtbot, services)
    window = services.window
    window.chat.profile_speculative = mtp(8)
    window.show()
    window.resize(*size)
    _live, finals = reply_with_stats(qtbot, services)
    final = finals[-1]
    assert len(final.acceptance_per_pos) == 8, final.acceptance_per_pos
    panel = window.stats_panel
    qtbot.wait(100)
    panel.repaint()
    qtbot.wait(50)
    area = panel.parentWidget().parentWidget()  # the scroll area's viewport, then the area
    assert window.size().toTuple() == size
    assert panel.height() >= panel.content_height > 0
    assert panel.width() <= area.viewport().width()  # nothing hidden sideways
    if size == (1000, 700):
        assert panel.content_height > area.viewport().height(), "the panel fits: nothing to prove here"
        assert area.verticalScrollBar().isVisible()
        assert area.verticalScrollBar().maximum() >= panel.height() - area.viewport().height()
    image = panel.grab().toImage()
    # the time legend's last entry is painted inside the panel, not past its bottom
    last = [name for name, secs in final.phase_seconds.items() if secs > 0][-1]
    rows = colour_rows(image, QColor(PHASE_COLORS[last]))
    assert rows and max(rows) < image.height() - 4, f"the '{last}' legend line is cut off"
    # nothing is drawn into the right margin: every line wrapped within the panel
    background = QColor(window.palette_.panel_bg).rgb()
    ratio = image.devicePixelRatio()
    inked = [(x, y) for x in range(int((panel.width() - 12) * ratio), image.width())
             for y in range(image.height()) if image.pixel(x, y) != background]
    assert not inked, f"text drawn into the right margin at {inked[:5]}"
