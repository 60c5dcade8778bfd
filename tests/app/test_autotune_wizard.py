"""The autotune wizard, walked from start to Apply against the real engine."""

from __future__ import annotations

from PySide6.QtWidgets import QWizard

from app.autotune_wizard import AutotuneWizard
from app.hardware_probe import HardwareProbe
from app.settings import Settings
from app.theme import LIGHT
from engine.autotune.profiles import ProfileStore
from engine.speculative.settings import SpeculativeSettings
from tests.engine.conftest import synth


def test_wizard_walks_from_hardware_to_apply_and_stores_the_profile(qtbot, isolated_dirs, tmp_path, monkeypatch):
    monkeypatch.setenv("MTP_STUDIO_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("MTP_STUDIO_CONFIG_DIR", str(tmp_path / "config"))
    model = synth("glm4moe", "oracle", agree=1.0).path()
    settings = Settings(model_path=str(model))
    probe = HardwareProbe()
    wizard = AutotuneWizard(settings, LIGHT, probe, n_max=2)
    qtbot.addWidget(wizard)
    wizard.show()

    qtbot.waitUntil(lambda: wizard.hardware_page.isComplete(), timeout=60000)
    assert "Fingerprint" in wizard.hardware_page.text.text()
    wizard.next()
    qtbot.waitUntil(wizard.model_page.isComplete, timeout=10000)  # the header is read off the GUI thread
    assert "1 MTP head" in wizard.model_page.facts.text()
    wizard.model_page.prompts.setValue(2)
    wizard.model_page.tokens.setValue(16)
    statuses: list[str] = []
    wizard.run_page.proc.sig_message.connect(lambda _m: statuses.append(wizard.run_page.status.text()))
    wizard.next()
    qtbot.waitUntil(lambda: wizard.run_page.isComplete(), timeout=180000)
    assert any(" left" in text for text in statuses), statuses  # the time left, estimated as it runs
    assert wizard.run_page.chart.ratios  # the live chart got data
    wizard.next()
    table = wizard.results_page.table
    assert table.rowCount() >= 2
    # each row's tok/s stands beside plain decoding's on the same prompts, so "vs off" agrees with them
    assert table.horizontalHeaderItem(2).text() == "off, same prompts"
    for row in range(table.rowCount()):
        tps, off, ratio = (float(table.item(row, c).text().strip("≈x")) for c in (1, 2, 3))
        assert abs(tps / off - ratio) <= 0.02 * ratio + 0.01, (tps, off, ratio)
    assert "Use:" in wizard.results_page.decision.text()
    wizard.button(QWizard.WizardButton.FinishButton).click()

    assert settings.speculative == "auto" and settings.model_path == str(model)
    assert Settings.load().speculative == "auto"  # persisted
    profiles = ProfileStore()._load()
    assert len(profiles) == 1
    (profile,) = profiles.values()
    assert profile["model_path"] == str(model)
    setting = SpeculativeSettings.from_json(profile["setting"])  # the one settings type, "off" spelled one way
    assert setting == wizard.applied_setting() and profile["setting"] == setting.to_json()
    assert not setting.enabled or setting.n_max <= 2


def test_a_draft_vocabulary_measured_by_the_wizard_is_shown_and_applied(qtbot, isolated_dirs, tmp_path, monkeypatch):
    from tests.engine.test_draft_vocab import model_152k

    monkeypatch.setenv("MTP_STUDIO_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("MTP_STUDIO_CONFIG_DIR", str(tmp_path / "config"))
    model = model_152k("glm4moe").path("combined")
    # the user's earlier choice for this model, to be replaced; another model's stays its own
    settings = Settings(model_path=str(model), draft_vocabs={str(model): 65_536, "/models/other.gguf": 40_000})
    wizard = AutotuneWizard(settings, LIGHT, HardwareProbe(), n_max=2)
    qtbot.addWidget(wizard)
    wizard.show()
    qtbot.waitUntil(lambda: wizard.hardware_page.isComplete(), timeout=60000)
    wizard.next()
    qtbot.waitUntil(wizard.model_page.isComplete, timeout=10000)
    wizard.model_page.prompts.setValue(3)
    wizard.model_page.tokens.setValue(12)
    wizard.next()
    qtbot.waitUntil(lambda: wizard.run_page.isComplete(), timeout=180000)
    result = wizard.run_page.result
    assert result is not None and result.draft_vocab in (0, 65_536, 32_768)
    wizard.next()
    assert "drafts among" in wizard.results_page.decision.text()
    wizard.button(QWizard.WizardButton.FinishButton).click()
    assert settings.draft_vocab_for(str(model)) == result.draft_vocab
    assert Settings.load().draft_vocab_for(str(model)) == result.draft_vocab  # persisted
    assert Settings.load().draft_vocab_for("/models/other.gguf") == 40_000
