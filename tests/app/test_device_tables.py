"""The Hardware page's device table shows each device's whole description: the walkthrough showed
"Intel(R) Xeon(R) …" cut in a narrow column at both 1000×700 and 1920×1080 while the Memory column took the
rest of the width. Measured: each cell's text against its column's width, no pixels compared."""

from __future__ import annotations

import dataclasses

import pytest
from PySide6.QtWidgets import QTableWidget

from app.hardware_page import HardwarePage
from app.hardware_probe import HardwareProbe

LONG_NAME = "Intel(R) Xeon(R) Platinum 8488C"  # the description the walkthrough showed cut
CELL_PADDING = 6  # the margins either side of a cell's text (the style's focus frame margin + 1, twice)


def cut_cells(table: QTableWidget) -> list[str]:
    metrics = table.fontMetrics()
    return [f"{table.horizontalHeaderItem(c).text()}: {item.text()!r} in {table.columnWidth(c)} px"
            for r in range(table.rowCount()) for c in range(table.columnCount())
            if (item := table.item(r, c)) is not None and item.text()
            and metrics.horizontalAdvance(item.text()) + CELL_PADDING > table.columnWidth(c)]


@pytest.mark.parametrize("width", [1000, 1920])
def test_the_device_table_shows_every_description_whole(qtbot, width):
    page = HardwarePage(HardwareProbe())
    qtbot.addWidget(page)
    page.resize(width - 20, 600)  # the page inside the window at that width
    page.show()
    qtbot.waitExposed(page)
    page.refresh()
    qtbot.waitUntil(lambda: page.report is not None, timeout=60000)
    # the real probe's report, its CPU named as the walkthrough's was wherever this machine's name is shorter
    # ("AMD EPYC" fits any column): the column sizing is what is checked, on any machine
    report = page.report
    report.engine_devices = [dataclasses.replace(d, description=LONG_NAME) if len(d.description) < len(LONG_NAME)
                             and d.type.lower() == "cpu" else d for d in report.engine_devices]
    page._show(report)
    qtbot.wait(50)
    table = page.devices
    assert table.rowCount() >= 1 and any(len(table.item(r, 1).text()) > 12 for r in range(table.rowCount()))
    assert not cut_cells(table), cut_cells(table)
    assert not table.horizontalScrollBar().isVisible()
