"""The chat header's model picker shows one arrow: Qt's own menu indicator,
not a "▾" in its text as well (the walkthrough of issue 30 saw two)."""

from __future__ import annotations

from PySide6.QtWidgets import QStyleOptionToolButton

from app.model_picker import ModelPicker

ARROWS = "▾▼▿⌄↓"


def test_the_picker_button_has_one_arrow_qts_own(qtbot):
    picker = ModelPicker([])
    qtbot.addWidget(picker)
    picker.show()
    option = QStyleOptionToolButton()
    picker.button.initStyleOption(option)
    assert option.features & QStyleOptionToolButton.ToolButtonFeature.HasMenu  # Qt draws its indicator
    for state in ({"model": None, "loading": True}, {"model": None}):
        picker.show_model(**state)
        assert picker.button.text() and not any(a in picker.button.text() for a in ARROWS), picker.button.text()
