"""``mtp-studio --smoke-test`` (app/smoke.py) on the real window and worker, and Help → About."""

from __future__ import annotations

import json

from PySide6.QtGui import QAction

from app.about import AboutDialog, about_lines
from app.smoke import PROMPTS, SmokeTest


def test_the_smoke_test_streams_kills_the_worker_recovers_and_passes(qtbot, services, capsys):
    before = services.settings.max_tokens
    smoke = SmokeTest(services)
    services.start()
    with qtbot.waitSignal(smoke.sig_finished, timeout=240000) as finished:
        smoke.begin()
    assert finished.args == [smoke.exit_code]
    steps = [json.loads(line)["smoke"] for line in capsys.readouterr().out.splitlines() if line.startswith('{"smoke"')]
    assert smoke.exit_code == 0, steps
    assert steps == ["window_shown", "model_loaded", "first_token", "reply_complete", "worker_killed", "recovered",
                     "first_token", "reply_complete", "passed"]
    text = services.window.transcript.toPlainText()
    assert all(p in text for p in PROMPTS)
    assert "interrupted" not in text  # the kill came between replies: nothing was lost
    assert services.settings.max_tokens == before  # the user's settings are put back


def test_the_smoke_test_fails_loudly_when_the_worker_dies_unasked(qtbot, services, capsys):
    smoke = SmokeTest(services)
    smoke.begin()
    with qtbot.waitSignal(smoke.sig_finished, timeout=1000) as finished:
        smoke._on_died("the engine process was stopped by SIGSEGV")
    assert finished.args == [1] and smoke.exit_code == 1
    last = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert last["smoke"] == "failed" and "SIGSEGV" in last["why"]


def test_help_about_shows_app_qt_and_engine_build(qtbot, services):
    about = next(a for a in services.window.findChildren(QAction) if a.text() == "About MTP Studio")
    assert about.menuRole() == QAction.MenuRole.AboutRole
    dialog = AboutDialog(services.window)
    qtbot.addWidget(dialog)
    text = dialog.text.text()
    lines = about_lines()
    assert lines[0].startswith("MTP Studio ") and "(source checkout)" in lines[0]
    from PySide6.QtCore import qVersion

    assert f"Qt {qVersion()}" in text
    assert "engine: llama-cpp-python" in text and "patches" in text


def test_the_hardware_page_names_the_loaded_cpu_library_and_a_packaged_app_builds_no_engine(qtbot, monkeypatch):
    from app.hardware_page import PACKAGED_ENGINE_NOTE, HardwarePage
    from app.hardware_probe import HardwareProbe
    from engine import frozen

    page = HardwarePage(HardwareProbe())
    qtbot.addWidget(page)
    page.refresh()
    qtbot.waitUntil(lambda: page.report is not None, timeout=60000)
    assert "Loaded backends: " in page.summary.text() and "CPU (libggml-cpu" in page.summary.text()
    assert page.build_button.isEnabled()
    monkeypatch.setattr(frozen, "is_frozen", lambda: True)
    page._show(page.report)
    assert not page.build_button.isEnabled() and PACKAGED_ENGINE_NOTE in page.recommendation.text()
