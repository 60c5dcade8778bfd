"""The model library's autotune profile and doctor columns, the Download button on its catalog rows (the
Recommended tab's download, through the same queue, from a local hub), and the chat header's model picker
searching the library: real GGUF files (synthetic), real profile store, real window."""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import QPoint, Qt

from app.models.library_rows import autotune_notes, label, make_rows
from app.models_page import ModelsPage
from engine.autotune.profiles import ProfileStore, new_profile
from engine.speculative.settings import mtp
from engine.store import library
from tests.app.conftest import start_and_load
from tests.app.test_model_library import folder  # noqa: F401 (a fixture)
from tests.app.test_models_page_flow import sidecar_family
from tests.fake_hub import FakeHub


def by_name(rows):
    return {r.name: r for r in rows}


def test_rows_name_the_doctors_pairing_and_the_autotune_profile(folder, tmp_path):  # noqa: F811
    store = ProfileStore(tmp_path / "profiles.json")
    combined = str(folder / "Glm-Combined-Q8_0.gguf")
    store.save(new_profile("this-machine", combined, "cpu-1", mtp(3), 1.84, "measured"))
    store.save(new_profile("other-machine", str(folder / "Glm-Trunk-Q8_0.gguf"), "cpu-1", mtp(2), 1.3, "measured"))
    rows = by_name(make_rows(library.scan(), [], {}, None, autotune_notes(store.profiles(), "this-machine")))
    trunk, sidecar, comb = rows["Glm-Trunk-Q8_0.gguf"], rows["mtp-Glm-Trunk-Q8_0.gguf"], rows["Glm-Combined-Q8_0.gguf"]
    assert trunk.doctor == "doctor: sidecar mtp-Glm-Trunk-Q8_0.gguf fits"
    assert sidecar.doctor == "doctor: with Glm-Trunk-Q8_0.gguf fits"
    assert comb.doctor == ""  # its head is in the file: no pairing to judge
    assert comb.autotune == "autotuned 1.84× (mtp n_max=3)" and comb.autotune in label(comb)
    assert trunk.autotune == "autotuned on another machine"
    assert sidecar.autotune == ""
    assert trunk.doctor in label(trunk)


def test_a_sidecar_without_its_model_says_so(folder):  # noqa: F811
    (folder / "Glm-Trunk-Q8_0.gguf").unlink()
    rows = by_name(make_rows(library.scan(), [], {}, None))
    assert rows["mtp-Glm-Trunk-Q8_0.gguf"].doctor == "doctor: no model on disk to pair with"
    assert "doctor" in label(rows["mtp-Glm-Trunk-Q8_0.gguf"])


@pytest.fixture()
def page(qtbot, folder, tmp_path):  # noqa: F811
    p = ModelsPage()
    qtbot.addWidget(p)
    yield p
    p.shutdown()


def test_download_on_a_catalog_row_of_the_library(qtbot, page, tmp_path, monkeypatch):
    repos = sidecar_family(tmp_path, monkeypatch)
    view = page.library
    with FakeHub(repos) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        view.refresh()
        qtbot.waitUntil(lambda: any(not r.on_disk for r in view.rows_shown()), timeout=20000)
        assert not view.download_button.isEnabled()
        row = next(i for i, r in enumerate(view.rows_shown()) if not r.on_disk)
        view.entries.setCurrentRow(row)
        assert view.download_button.isEnabled() and not view.preset_button.isEnabled()
        view.download_button.click()
        assert "Downloading Synth (MTP sidecar)" in view.facts.toPlainText()
        qtbot.waitUntil(lambda: page.pair.sidecar_path is not None, timeout=30000)
        assert page.pair.target_path.endswith("Synth-Q8_0.gguf")
        # the library lists the downloaded files, and the catalog row is gone
        qtbot.waitUntil(lambda: "Synth-Q8_0.gguf" in [r.name for r in view.rows_shown()], timeout=20000)
        assert all(r.on_disk for r in view.rows_shown())
        view.entries.setCurrentRow(0)
        assert not view.download_button.isEnabled()


def test_the_chat_header_picker_searches_the_library(qtbot, services, folder):  # noqa: F811
    start_and_load(qtbot, services)
    window = services.window
    window.show()
    picker = window.model_picker
    picker.menu.popup(picker.button.mapToGlobal(QPoint(0, picker.button.height())))
    qtbot.waitUntil(lambda: picker.library is not None, timeout=20000)  # opening it scanned the library
    qtbot.waitUntil(picker.search.hasFocus, timeout=2000)
    qtbot.keyClicks(picker.search, "trunk q8")
    found = [t for t in picker.actions_text(fill=False) if "·" in t]
    assert [t.split("  ·  ")[0] for t in found] == ["Glm-Trunk-Q8_0.gguf", "mtp-Glm-Trunk-Q8_0.gguf"]
    picker.search.clear()
    qtbot.keyClicks(picker.search, "nothing like it")
    assert "No model in the library matches" in picker.actions_text(fill=False)
    picker.search.clear()
    qtbot.keyClicks(picker.search, "combined")
    with qtbot.waitSignal(picker.sig_pick) as picked:
        qtbot.keyClick(picker.search, Qt.Key.Key_Return)
    assert picked.args == [str(folder / "Glm-Combined-Q8_0.gguf")]
    qtbot.waitUntil(lambda: window.models.sheet is not None, timeout=5000)  # the load sheet for it
    assert Path(window.models.sheet.choice.path).name == "Glm-Combined-Q8_0.gguf"
    window.models.sheet.close()
