"""The models and hardware pages, driven through their widgets."""

from __future__ import annotations

from PySide6.QtCore import Qt

from app.hardware_page import HardwarePage
from app.hardware_probe import HardwareProbe
from app.models_page import ModelsPage
from tests.engine.conftest import synth
from tests.fake_hub import FakeHub


def test_models_page_searches_lists_files_downloads_and_checks_a_pair(qtbot, isolated_dirs, tmp_path, monkeypatch):
    monkeypatch.setenv("MTP_STUDIO_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("MTP_STUDIO_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    model = synth("glm4moe")
    files = {"Synth-Q8_0.gguf": model.path("trunk"), "mtp-Synth-Q8_0.gguf": model.path("sidecar-relative")}
    with FakeHub({"test/Synth-GGUF": files}) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        page = ModelsPage()
        qtbot.addWidget(page)
        page.refresh_library()
        page.hub.query.setText("synth")
        page.hub.search_button.click()
        qtbot.waitUntil(lambda: page.hub.results.count() and page.hub.results.item(0).text() != "Searching…",
                        timeout=20000)
        first = page.hub.results.item(0)
        assert first.data(Qt.ItemDataRole.UserRole) == "test/Synth-GGUF", first.text()
        page.hub.results.setCurrentRow(0)
        qtbot.waitUntil(lambda: page.hub.files.rowCount() == 2, timeout=20000)
        assert "mtp-Synth-Q8_0.gguf" in page.hub.sidecar_hint.text()
        page.hub.files.selectAll()
        page.hub.download_selected()
        rows = [page.downloads.rows.itemAt(i).widget() for i in range(page.downloads.rows.count())]
        assert [r.filename for r in rows] == ["Synth-Q8_0.gguf", "mtp-Synth-Q8_0.gguf"]
        qtbot.waitUntil(lambda: all(r.speed.text().startswith("done") for r in rows), timeout=30000)
        qtbot.waitUntil(lambda: sum(r.on_disk for r in page.library.rows_shown()) >= 2, timeout=30000)
        names = [page.library.entries.item(i).text() for i in range(page.library.entries.count())]
        assert any(n.startswith("Synth-Q8_0.gguf") for n in names)

        by_name = {page.library.entries.item(i).text().split("  ")[0]: i
                   for i in range(page.library.entries.count())}
        page.library.entries.setCurrentRow(by_name["Synth-Q8_0.gguf"])
        qtbot.waitUntil(lambda: "architecture  glm4moe" in page.library.facts.toPlainText(), timeout=10000)
        assert "memory at n_ctx" in page.library.facts.toPlainText()
        page.pair.set_target.click()
        page.library.entries.setCurrentRow(by_name["mtp-Synth-Q8_0.gguf"])
        page.pair.set_sidecar.click()
        page.pair.doctor_button.click()
        qtbot.waitUntil(lambda: "Repair can fix it" in page.library.facts.toPlainText(), timeout=10000)
        page.pair.repair_button.click()
        qtbot.waitUntil(lambda: "loaded with MTP" in page.library.facts.toPlainText(), timeout=120000)
        assert page.pair.sidecar_path.endswith(".repaired.gguf")
        with qtbot.waitSignal(page.sig_use_model) as used:
            page.pair.use_button.click()
        assert used.args[0].endswith("Synth-Q8_0.gguf") and used.args[1].endswith(".repaired.gguf")


def test_hardware_page_shows_the_machine_and_the_matching_build(qtbot):
    page = HardwarePage(HardwareProbe())
    qtbot.addWidget(page)
    page.refresh()
    qtbot.waitUntil(lambda: page.report is not None, timeout=60000)
    shown = page.summary.text()  # in every failure message: the probe's notes say why a report is short
    assert "Fingerprint" in shown and "Active engine" in shown, shown
    assert "Engine patches: series " in shown, shown  # the build record's patch series
    assert page.devices.rowCount() >= 1 and page.devices.item(0, 2).text() == "cpu", shown
    assert "engine" in page.recommendation.text()
    assert page.build_button.isEnabled() and page.build_button.text() == "Rebuild the cpu engine"


def test_the_models_page_estimates_a_sliding_window_model_as_the_preference_keeps_its_cache(
        qtbot, default_model):
    """The built-in Gemma 3 keeps its windowed layers' window only unless Preferences keep the whole cache:
    the Models page's KV cache line follows that, as the load sheet's estimate does."""
    from PySide6.QtWidgets import QListWidgetItem

    from app.settings import Settings

    seen = []
    for swa_full in (False, True):
        page = ModelsPage()
        qtbot.addWidget(page)
        page.library.preferences = Settings(swa_full=swa_full)
        page.library.ctx.setValue(32768)
        item = QListWidgetItem("gemma")
        item.setData(Qt.ItemDataRole.UserRole, str(default_model))
        page.library.entries.addItem(item)
        page.library.entries.setCurrentRow(page.library.entries.count() - 1)
        qtbot.waitUntil(lambda p=page: "memory at n_ctx 32768" in p.library.facts.toPlainText(), timeout=10000)
        kv = next(ln for ln in page.library.facts.toPlainText().splitlines() if "KV cache" in ln)
        seen.append(float(kv.split()[-2]))
    assert seen[0] * 4 < seen[1], seen


def test_the_models_page_estimate_follows_the_whole_cache_preference_when_it_changes(
        qtbot, services, default_model, monkeypatch):
    """Preferences → "Keep a sliding-window model's whole cache": the Models page's estimate of the selected
    model is read again as the preference changes, not only at its next selection."""
    from PySide6.QtWidgets import QListWidgetItem

    from app.settings_dialog import SettingsDialog

    window = services.window
    library = window.models_page.library
    library.ctx.setValue(32768)
    item = QListWidgetItem("gemma")
    item.setData(Qt.ItemDataRole.UserRole, str(default_model))
    library.entries.addItem(item)
    library.entries.setCurrentItem(item)

    def kv() -> float:
        text = library.facts.toPlainText()
        return float(next(ln for ln in text.splitlines() if "KV cache" in ln).split()[-2]) \
            if "memory at n_ctx 32768" in text else 0.0

    qtbot.waitUntil(lambda: kv() > 0, timeout=10000)
    window_only = kv()

    def user(dialog: SettingsDialog) -> int:
        dialog.swa_full.setChecked(True)
        dialog.accept()
        return dialog.result()

    monkeypatch.setattr(SettingsDialog, "exec", user)
    window.open_settings()
    qtbot.waitUntil(lambda: kv() > 4 * window_only, timeout=10000)
