"""The Models page's finished flows: recommended MTP models offline with fit
badges and a plain offline message in about 3 s, one Download for target and
sidecar, and a repair that ends with the repaired pair selected and ready."""

from __future__ import annotations

import json
import shutil
import threading
import time

import pytest
from PySide6.QtCore import Qt

from app.models_page import ModelsPage
from engine.store import catalog, fit, hub
from tests.engine.conftest import synth
from tests.engine.test_catalog import closed_port_url
from tests.fake_hub import FakeHub

GIB = 2**30


@pytest.fixture()
def page(qtbot, isolated_dirs, tmp_path, monkeypatch):
    monkeypatch.setenv("MTP_STUDIO_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("MTP_STUDIO_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    (tmp_path / "config").mkdir()
    monkeypatch.setattr(fit, "available_memory", lambda: 16 * GIB)
    p = ModelsPage()
    qtbot.addWidget(p)
    yield p
    p.shutdown()


def test_offline_the_catalog_is_shown_with_fit_badges_and_the_offline_message_comes_within_3_s(
        qtbot, page, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", closed_port_url())
    recs = catalog.load()
    on_gui: list[str] = []  # the catalog read and the connection probe must not block the GUI thread
    for module, name in ((catalog, "load"), (hub, "unreachable_reason")):
        original = getattr(module, name)

        def recorder(*a, _original=original, _name=name, **kw):
            if threading.current_thread() is threading.main_thread():
                on_gui.append(_name)
            return _original(*a, **kw)

        monkeypatch.setattr(module, name, recorder)
    start = time.monotonic()
    page.show_recommended()
    view = page.recommended
    qtbot.waitUntil(lambda: view.status.text().startswith("Offline"), timeout=3500)
    assert time.monotonic() - start < 3.5
    assert "built-in catalog" in view.status.text() and "Errno" not in view.status.text()
    qtbot.waitUntil(lambda: view.table.rowCount() == len(recs), timeout=5000)
    badges = {view.table.item(i, 0).text(): view.table.item(i, 4).text() for i in range(len(recs))}
    assert badges["Qwen3.5 / 3.6 (hybrid, one MTP head)"] == "fits"  # ≈ 5 GiB against 16 GiB
    assert badges["DeepSeek V3 (one MTP head)"] == "does not fit"
    assert set(badges.values()) <= {"fits", "tight fit", "does not fit", "size unknown"}
    assert "GiB" in view.table.item(0, 3).text()
    sidecar_rows = [i for i, r in enumerate(recs) if r.sidecar]
    assert sidecar_rows and view.buttons[sidecar_rows[0]].text() == "Download model + sidecar"

    page.hub.query.setText("qwen")
    start = time.monotonic()
    page.hub.search_button.click()
    status = page.hub.status
    qtbot.waitUntil(lambda: status.text().startswith("Offline"), timeout=3500)
    assert time.monotonic() - start < 3.5
    assert "cannot be reached" in status.text() and "Errno" not in status.text()
    # the whole message on its own wrapped line (a list row cut it off), and the built-in catalog searched
    qtbot.waitUntil(lambda: "built-in catalog" in status.text(), timeout=3000)
    page.resize(1000, 700)
    page.sections.setCurrentWidget(page.hub)
    page.show()
    qtbot.wait(50)
    assert status.isVisibleTo(page) and status.wordWrap() and status.heightForWidth(status.width()) <= status.height()
    qwen = [r for r in recs if "qwen" in f"{r.name} {r.arch} {r.repo}".lower()]
    shown = [page.hub.results.item(i).text() for i in range(page.hub.results.count())]
    assert qwen and shown == [f"{r.name}  ·  {r.repo}  ·  built-in catalog" for r in qwen]
    assert f"{len(qwen)} model(s) in the built-in catalog match" in status.text()
    assert on_gui == []


def sidecar_family(tmp_path, monkeypatch, quants: tuple[str, ...] = ("Q8_0",)) -> dict:
    """A catalog of one family, the synthetic glm4moe trunk in ``quants`` with its MTP sidecar in another
    repository (Q8_0 recommended), made the app's catalog; returns the fake hub's repositories."""
    model = synth("glm4moe")
    repos = {"test/Synth-GGUF": {f"Synth-{q}.gguf": model.path("trunk") for q in quants},
             "test/Synth-MTP-GGUF": {"Synth-MTP-Q8_0.gguf": model.path("sidecar")}}
    family = {"name": "Synth (MTP sidecar)", "arch": "glm4moe", "targets": ["test/Synth-GGUF"], "mtp": "sidecar",
              "recommended": {"repo": "test/Synth-GGUF", "quant": "Q8_0", "size": 1000,
                              "size_basis": "a test figure"},
              "sidecar": {"repo": "test/Synth-MTP-GGUF", "pattern": "*MTP*.gguf", "size": 100}}
    path = tmp_path / "catalog.json"
    path.write_text(json.dumps({"version": 2, "families": [family]}))
    monkeypatch.setattr(catalog, "CATALOG", path)
    return repos


def test_download_both_fetches_target_and_sidecar_and_sets_the_pair(qtbot, page, tmp_path, monkeypatch):
    model, repos = synth("glm4moe"), sidecar_family(tmp_path, monkeypatch, ("Q8_0", "Q4_K_M"))
    with FakeHub(repos) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        page.show_recommended()
        view = page.recommended
        qtbot.waitUntil(lambda: view.online is True and view.table.rowCount() == 1, timeout=10000)
        assert view.buttons[0].text() == "Download model + sidecar"
        view.buttons[0].click()
        qtbot.waitUntil(lambda: page.pair.sidecar_path is not None, timeout=30000)
        assert page.pair.target_path.endswith("Synth-Q8_0.gguf")
        assert page.pair.sidecar_path.endswith("Synth-MTP-Q8_0.gguf")
        assert "Synth-Q8_0.gguf" in page.pair.label.text() and "Synth-MTP-Q8_0.gguf" in page.pair.label.text()
        rows = [page.downloads.rows.itemAt(i).widget() for i in range(page.downloads.rows.count())]
        assert sorted(r.filename for r in rows) == ["Synth-MTP-Q8_0.gguf", "Synth-Q8_0.gguf"]
        assert all(r.speed.text().startswith("done") for r in rows)
        assert view.buttons[0].text() == "Downloaded" and "set as the pair" in view.status.text()
        real = model.path("trunk").stat().st_size + model.path("sidecar").stat().st_size
        assert view.table.item(0, 3).text() == f"{real / GIB:.2f} GiB"  # the hub's size replaces the catalog's


def test_a_vision_models_row_says_plus_projector_with_its_size_before_the_click_and_a_text_models_does_not(
        qtbot, page, tmp_path, monkeypatch):
    from engine.synth import SynthSpec
    from engine.synth.projector import ProjectorSpec, projector_path

    model = synth("glm4moe")
    projector = projector_path(ProjectorSpec(target=SynthSpec(arch="qwen35", weights="random", seed=1)))
    repos = {"test/Vision-GGUF": {"Vision-Q8_0.gguf": model.path("combined"), "mmproj-Vision-F16.gguf": projector},
             "test/Text-GGUF": {"Text-Q8_0.gguf": model.path("combined")}}
    families = [{"name": name, "arch": "glm4moe", "targets": [repo], "mtp": "in-file",
                 "recommended": {"repo": repo, "quant": "Q8_0", "size": 1000, "size_basis": "a test figure"}}
                for name, repo in (("Vision", "test/Vision-GGUF"), ("Text", "test/Text-GGUF"))]
    path = tmp_path / "catalog.json"
    path.write_text(json.dumps({"version": 2, "families": families}))
    monkeypatch.setattr(catalog, "CATALOG", path)
    with FakeHub(repos) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        page.show_recommended()
        view = page.recommended
        combined = model.path("combined").stat().st_size
        qtbot.waitUntil(lambda: view.table.rowCount() == 2 and view.table.item(1, 3).text() != "≈ 0.0 GiB",
                        timeout=10000)  # both looked up: the hub's sizes replace the catalog's
        qtbot.waitUntil(lambda: view.table.item(0, 3).text() != "≈ 0.0 GiB", timeout=10000)
        projector_gib = f"{projector.stat().st_size / GIB:.2f} GiB"
        assert view.table.item(0, 1).text() == f"test/Vision-GGUF (Q8_0) + projector ({projector_gib})"
        assert view.buttons[0].text() == "Download model + projector"
        assert view.table.item(0, 3).text() == f"{(combined + projector.stat().st_size) / GIB:.2f} GiB"
        assert "mmproj-Vision-F16.gguf" in view.table.item(0, 1).toolTip()
        assert "projector" not in view.table.item(1, 1).text() and view.buttons[1].text() == "Download"
        assert view.table.item(1, 3).text() == f"{combined / GIB:.2f} GiB"
        # the hub's file list names the projector as what it is, and the hint offers it
        page.hub._show_files("test/Vision-GGUF", hub.repo_files("test/Vision-GGUF", server.url))
        kinds = {page.hub.files.item(i, 3).text(): page.hub.files.item(i, 2).text() for i in range(2)}
        assert kinds == {"Vision-Q8_0.gguf": "model", "mmproj-Vision-F16.gguf": "vision projector"}
        assert "Vision projector here: mmproj-Vision-F16.gguf" in page.hub.sidecar_hint.text()


def on_disk(page) -> int:
    """The library's rows for files (the catalog's models not downloaded follow them)."""
    return sum(row.on_disk for row in page.library.rows_shown())


def test_repair_keeps_its_result_selects_the_copy_updates_the_pair_and_offers_the_repaired_pair(
        qtbot, page, tmp_path):
    model = synth("glm4moe")
    folder = tmp_path / "data" / "models" / "local"
    folder.mkdir(parents=True)
    target = shutil.copy(model.path("trunk"), folder / "Synth-Q8_0.gguf")
    broken = shutil.copy(model.path("sidecar-relative"), folder / "mtp-Synth-Q8_0.gguf")
    page.refresh_library()
    qtbot.waitUntil(lambda: on_disk(page) == 2, timeout=10000)
    labels = {page.library.entries.item(i).text().split("  ")[0]: page.library.entries.item(i).text()
              for i in range(page.library.entries.count())}
    assert "trunk-only" not in labels["mtp-Synth-Q8_0.gguf"] and "misnumbered" in labels["mtp-Synth-Q8_0.gguf"]

    page.pair.target_path, page.pair.sidecar_path = str(target), str(broken)
    page.pair.repair_button.click()
    qtbot.waitUntil(lambda: page.library.facts.toPlainText().startswith("Repaired:"), timeout=120000)
    repaired = str(folder / "mtp-Synth-Q8_0.repaired.gguf")
    qtbot.waitUntil(lambda: on_disk(page) == 3, timeout=10000)  # the rescan that used to overwrite it
    qtbot.wait(300)
    facts = page.library.facts.toPlainText()
    assert facts.startswith("Repaired:") and "loaded with MTP" in facts
    assert page.library.entries.currentItem().data(Qt.ItemDataRole.UserRole) == repaired
    assert "mtp-Synth-Q8_0.repaired.gguf" in page.pair.label.text() and "(repaired copy)" in page.pair.label.text()
    assert "mtp-Synth-Q8_0.gguf " not in page.pair.label.text() + " "
    assert not page.pair.use_repaired.isHidden()
    with qtbot.waitSignal(page.sig_use_model) as used:
        page.pair.use_repaired.click()
    assert used.args == [str(target), repaired, ""]  # no vision projector beside the target
    assert (page.pair.target_path, page.pair.sidecar_path) == (str(target), repaired)
