"""The model library and per-model presets: every model on disk and in the catalog with what it is, search
and filters over them, a preset edited in its sheet, kept on disk, and applied by the real worker when that
model loads (context and threads in the load, sampling, system prompt and chat template in the chat)."""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import replace

import pytest
from PySide6.QtCore import Qt

from app.models.library_rows import LibraryFilter, label, make_rows, quantization_of
from app.models.preset_dialog import PresetDialog
from app.models.presets import ModelPreset, ModelRecords, key
from app.models_page import ModelsPage
from app.reply_values import stored
from engine.sampling import SamplingParams
from engine.store import catalog, fit, library
from tests.app.conftest import send_and_wait, start_and_load
from tests.engine.conftest import synth

GIB = 2**30


@pytest.fixture()
def folder(tmp_path, monkeypatch):
    """A models folder with a combined MTP model, a trunk and its sidecar, under names with quantizations."""
    monkeypatch.setenv("MTP_STUDIO_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("MTP_STUDIO_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(fit, "available_memory", lambda: 16 * GIB)
    out = tmp_path / "data" / "models" / "local"
    out.mkdir(parents=True)
    model = synth("glm4moe")
    shutil.copy(model.path("combined"), out / "Glm-Combined-Q8_0.gguf")
    shutil.copy(model.path("trunk"), out / "Glm-Trunk-Q8_0.gguf")
    shutil.copy(model.path("sidecar"), out / "mtp-Glm-Trunk-Q8_0.gguf")
    return out


def test_rows_describe_each_file_then_the_catalog_models_not_downloaded(folder):
    entries = library.scan()
    recs = catalog.load()
    used = {key(folder / "Glm-Trunk-Q8_0.gguf"): time.time() - 3 * 86400}
    rows = make_rows(entries, recs, used, 16 * GIB)
    disk = [r for r in rows if r.on_disk]
    assert len(disk) == 3 and len(rows) == 3 + len(recs)
    assert disk[0].name == "Glm-Trunk-Q8_0.gguf"  # the one used first, then by name
    by_name = {r.name: r for r in rows}
    combined, trunk = by_name["Glm-Combined-Q8_0.gguf"], by_name["Glm-Trunk-Q8_0.gguf"]
    assert combined.architecture == "glm4moe" and combined.quantization == "Q8_0" and combined.has_mtp
    assert combined.mtp.startswith("MTP head in the file") and combined.size == (folder / combined.name).stat().st_size
    assert trunk.mtp == "no MTP head" and not trunk.has_mtp and by_name["mtp-Glm-Trunk-Q8_0.gguf"].mtp == "MTP sidecar"
    assert combined.fits is True and combined.last_used is None
    text = label(trunk)
    assert text.startswith("Glm-Trunk-Q8_0.gguf  ·  glm4moe · Q8_0 · ") and "used 3 days ago" in text
    assert "never used" in label(combined)
    catalog_row = by_name[recs[0].name]
    assert catalog_row.path is None and catalog_row.repo == recs[0].repo and catalog_row.has_mtp
    assert "in the catalog" in label(catalog_row)
    huge = [r for r in rows if not r.on_disk and r.size and r.size > 16 * GIB]
    assert huge and all(r.fits is False and "does not fit" in label(r) for r in huge)


def test_quantization_comes_from_the_name_else_from_the_header(folder, tmp_path):
    plain = tmp_path / "model.gguf"
    shutil.copy(folder / "Glm-Combined-Q8_0.gguf", plain)
    entry = library._entry(plain)
    assert set(entry.facts.quantization) == {"F32"}  # the synthetic model's weights are all F32
    assert quantization_of(entry) == "F32"  # no name to read: the header's weight type
    assert quantization_of(library._entry(folder / "Glm-Combined-Q8_0.gguf")) == "Q8_0"
    named = tmp_path / "Qwen3.5-9B-UD-IQ4_XS.gguf"
    shutil.copy(plain, named)
    assert quantization_of(library._entry(named)) == "UD-IQ4_XS"


def test_filters_search_words_place_mtp_fit_architecture_and_quantization(folder):
    rows = make_rows(library.scan(), catalog.load(), {}, 16 * GIB)

    def names(**kw):
        return {r.name for r in rows if LibraryFilter(**kw).matches(r)}

    assert names(where="disk") == {"Glm-Combined-Q8_0.gguf", "Glm-Trunk-Q8_0.gguf", "mtp-Glm-Trunk-Q8_0.gguf"}
    assert names(where="catalog") == {r.name for r in rows if r.path is None}
    assert names(text="trunk q8_0") == {"Glm-Trunk-Q8_0.gguf", "mtp-Glm-Trunk-Q8_0.gguf"}
    assert names(text="head in the file", where="disk") == {"Glm-Combined-Q8_0.gguf"}
    glm = {r.name for r in rows if r.path is None and r.architecture == "glm4moe"}
    assert glm and names(architecture="glm4moe") == names(where="disk") | glm  # the catalog's GLM family too
    assert names(quantization="Q8_0", where="disk") == names(where="disk")
    assert all(r.fits for r in rows if LibraryFilter(fits_only=True).matches(r))
    assert len(names(fits_only=True)) < len(rows)
    assert names(mtp_only=True) == {r.name for r in rows if r.has_mtp}


def test_the_library_lists_disk_and_catalog_and_its_filters_narrow_the_list(qtbot, folder):
    page = ModelsPage(records=ModelRecords())
    qtbot.addWidget(page)
    view = page.library
    page.refresh_library()
    qtbot.waitUntil(lambda: view.entries.count() > 3, timeout=20000)
    shown = view.rows_shown()
    assert sum(r.on_disk for r in shown) == 3 and sum(not r.on_disk for r in shown) == len(catalog.load())
    assert view.architecture.findData("glm4moe") >= 0 and view.quantization.findData("Q8_0") >= 0
    view.where.setCurrentIndex(view.where.findData("disk"))
    assert view.entries.count() == 3
    view.search.setText("combined")
    assert [r.name for r in view.rows_shown()] == ["Glm-Combined-Q8_0.gguf"]
    view.search.clear()
    view.where.setCurrentIndex(view.where.findData("catalog"))
    view.mtp_only.setChecked(True)
    assert view.entries.count() == len(catalog.load())
    view.entries.setCurrentRow(0)  # a catalog model: what the catalog says, and no preset (no file yet)
    assert "repository" in view.facts.toPlainText() and not view.preset_button.isEnabled()
    assert view.selected_path() is None
    with qtbot.assertNotEmitted(page.sig_use_model):
        qtbot.keyClick(view.entries, Qt.Key.Key_Return)  # nothing to load yet
    view.where.setCurrentIndex(view.where.findData("disk"))
    view.mtp_only.setChecked(False)
    view.search.setText("combined")
    view.entries.setCurrentRow(0)
    qtbot.waitUntil(lambda: "architecture  glm4moe" in view.facts.toPlainText(), timeout=10000)
    with qtbot.waitSignal(page.sig_use_model) as used:
        qtbot.keyClick(view.entries, Qt.Key.Key_Return)  # Enter on a file loads it in the chat
    assert used.args == [str(folder / "Glm-Combined-Q8_0.gguf"), "", ""]  # no vision projector beside it
    view.search.clear()
    view.mtp_only.setChecked(True)
    view.where.setCurrentIndex(view.where.findData("all"))
    view.architecture.setCurrentIndex(view.architecture.findData("glm4moe"))
    glm = [r for r in catalog.load() if r.arch == "glm4moe"]
    assert view.entries.count() == 2 + len(glm)  # glm4moe with MTP: the combined file, the sidecar, the catalog's
    assert view.entries.horizontalScrollBar().maximum() == 0  # long rows wrap


def test_a_preset_is_edited_in_its_sheet_kept_on_disk_and_read_back(qtbot, folder):
    records = ModelRecords()
    page = ModelsPage(records=records)
    qtbot.addWidget(page)
    view = page.library
    page.refresh_library()
    qtbot.waitUntil(lambda: view.entries.count() > 3, timeout=20000)
    target = str(folder / "Glm-Combined-Q8_0.gguf")
    view.entries.setCurrentRow([r.path for r in view.rows_shown()].index(target))
    assert view.preset_button.isEnabled()
    qtbot.waitUntil(lambda: "architecture  glm4moe" in view.facts.toPlainText(), timeout=10000)
    dialog = view.edit_preset()
    assert isinstance(dialog, PresetDialog) and not dialog.sampling_box.isChecked()
    dialog.sampling_box.setChecked(True)
    dialog.sampling["temperature"].setValue(0.3)
    dialog.ctx_box.setChecked(True)
    dialog.n_ctx.setValue(1024)
    dialog.prompt_box.setChecked(True)
    dialog.system_prompt.setPlainText("You are terse.")
    with qtbot.waitSignal(page.sig_preset) as saved:
        dialog.accept()
    assert saved.args == [target] and "Preset saved" in view.facts.toPlainText()
    preset = ModelRecords().preset(target)  # from the file
    assert preset.sampling is not None and preset.sampling.temperature == pytest.approx(0.3)
    assert (preset.n_ctx, preset.n_threads, preset.system_prompt, preset.chat_template) == (
        1024, None, "You are terse.", None)
    data = json.loads(records.path.read_text())
    assert data["models"][key(target)]["preset"]["n_ctx"] == 1024
    again = view.edit_preset()  # the sheet shows what was saved
    assert again.sampling_box.isChecked() and again.n_ctx.value() == 1024 and not again.threads_box.isChecked()
    again.reject()


def test_a_damaged_preset_file_costs_only_the_bad_parts(tmp_path):
    path = tmp_path / "models.json"
    path.write_text(json.dumps({"models": {
        "/m/a.gguf": {"preset": {"n_ctx": "big", "n_threads": 2, "sampling": {"temperature": 99},
                                 "system_prompt": "Hi"}, "last_used": 5},
        "/m/b.gguf": "nonsense"}}))
    records = ModelRecords(path)
    assert records.get("/m/a.gguf").preset == ModelPreset(n_threads=2, system_prompt="Hi")
    assert records.get("/m/a.gguf").last_used == 5 and records.get("/m/b.gguf").preset.empty
    path.write_text("{not json")
    assert ModelRecords(path).last_used() == {}


def test_a_models_preset_applies_when_it_loads_and_its_last_use_is_kept(qtbot, services, folder):
    services.settings.n_threads = 1
    services.settings.n_ctx = 512
    services.settings.max_tokens = 4
    start_and_load(qtbot, services)
    window, records = services.window, services.window.models.records
    target = str(folder / "Glm-Combined-Q8_0.gguf")
    template = "{% for m in messages %}{{ m.content }}|{% endfor %}"
    sampling = replace(SamplingParams(), temperature=0.0, repeat_penalty=1.0, top_k=7)
    records.set_preset(target, ModelPreset(sampling=sampling, n_ctx=1024, n_threads=1,
                                           system_prompt="Answer in one word.", chat_template=template))
    sent: list = []
    original = services.client._write
    services.client._write = lambda message: (sent.append(message), original(message))[1]
    with qtbot.waitSignal(services.client.sig_loaded, timeout=60000) as loaded:
        window.models.use(target, None)
    assert loaded.args[0].model.n_ctx == 1024 and services.settings.n_ctx == 1024  # the preset's context
    assert records.get(target).last_used == pytest.approx(time.time(), abs=60)
    window.chat.new_conversation()
    assert services.store.get(window.chat.conversation_id).system_prompt == "Answer in one word."
    assert window.chat.chat_values().sampling.top_k == 7
    send_and_wait(qtbot, window, "Hello")
    request = next(m for m in sent if type(m).__name__ == "GenerateRequestMsg")
    assert request.template == template and request.sampling.top_k == 7
    conv = window.chat.conversation_id
    chat_sampling = replace(window.chat.chat_values().sampling, top_k=9)
    services.store.update(conv, settings=stored(replace(window.chat.chat_values(), sampling=chat_sampling)),
                          system_prompt="Answer in two words.")
    window.models.save_chat_as_preset()  # Model → Save this chat's settings as the model's preset
    kept = ModelRecords().preset(target)
    assert kept.sampling == chat_sampling and kept.system_prompt == "Answer in two words."
    assert (kept.n_ctx, kept.chat_template) == (1024, template)  # the parts the chat has not: unchanged
    window.models.use(None, None)  # the built-in model has no preset: the preferences again
    qtbot.waitUntil(lambda: window.models.model is not None and window.models.model.is_default_model,
                    timeout=60000)
    window.chat.new_conversation()
    assert window.chat.chat_values().sampling == services.settings.sampling
    assert services.store.get(window.chat.conversation_id).system_prompt == services.settings.system_prompt


def test_the_built_in_models_file_is_marked_used_and_its_preset_applies(qtbot, services):
    """The library lists the built-in model's file like any other and offers its Preset…; the walkthrough
    showed it "never used" while loaded, and a preset saved for it ("it applies when the model loads") that
    never applied: both were kept only for models loaded by path."""
    from engine.default_model import default_model_file

    start_and_load(qtbot, services)
    window, records = services.window, services.window.models.records
    builtin = str(default_model_file())
    assert window.models.model.is_default_model and services.settings.model_path is None
    assert records.get(builtin).last_used == pytest.approx(time.time(), abs=60)
    page = window.models_page
    page.refresh_library()
    qtbot.waitUntil(lambda: page.library.row_for(builtin) is not None, timeout=30000)
    assert "never used" not in label(page.library.row_for(builtin))
    sampling = replace(services.settings.sampling, top_k=7)
    with qtbot.waitSignal(page.sig_preset):
        page.library._save_preset(builtin, ModelPreset(sampling=sampling, system_prompt="Answer in one word."))
    window.chat.new_conversation()
    assert window.chat.chat_values().sampling.top_k == 7
    assert services.store.get(window.chat.conversation_id).system_prompt == "Answer in one word."
    window.models.save_chat_as_preset()  # Model → Save this chat's settings as the model's preset: the built-in's
    assert ModelRecords().preset(builtin).sampling.top_k == 7
