"""Safe model switching and the model loader (issue 18, items 2 and 4), against
the real worker: a failed load keeps the previous model and the settings keep
it too, the failure dialog offers the ways on, Send says why it is disabled,
and the load sheet loads with what it shows, estimates memory off the GUI
thread, and ejects."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from PySide6.QtWidgets import QMessageBox

from app.engine_status import model_text
from app.load_plan import gpu_offload_reason, plan_memory, vram_from_report
from app.settings import Settings
from engine.hardware.parsers import GPU
from engine.hardware.probe import EngineDevice, HardwareReport
from tests.app.conftest import start_and_load
from tests.engine.conftest import synth

LOAD_TIMEOUT = 60000


@pytest.fixture()
def services(services):
    """The app on one thread and a small context: the test machine's cores are shared."""
    services.settings.n_threads = 1
    services.settings.n_ctx = 512
    services.settings.max_tokens = 4
    return services


@pytest.fixture(autouse=True)
def no_modal_warnings(monkeypatch) -> None:
    """A modal warning would block an offscreen test for ever: the failure dialog must not be one."""
    def refuse(*_args: Any) -> None:
        raise AssertionError("a modal warning was shown; the failure dialog must offer ways on")

    monkeypatch.setattr("app.model_controller.QMessageBox.warning", refuse)


def failed_load(qtbot, services, path: str) -> str:
    """Ask for ``path`` and wait for the load to fail; the error's message."""
    with qtbot.waitSignal(services.client.sig_error, timeout=LOAD_TIMEOUT,
                          check_params_cb=lambda ev: ev.final) as error:
        services.window.models.use(path, None)
    return error.args[0].message


def reply(qtbot, window, text: str) -> str:
    with qtbot.waitSignal(window.chat.sig_reply_finished, timeout=90000) as finished:
        window.composer.setPlainText(text)
        window.send_button.click()
    return finished.args[0]


def buttons(box: QMessageBox) -> list[str]:
    return [b.text() for b in box.buttons()]


def test_a_bad_model_path_is_not_saved_and_the_previous_model_keeps_answering(qtbot, services, tmp_path):
    start_and_load(qtbot, services)
    window = services.window
    loaded_text = window.engine_status.model_label.text()
    assert "gemma" in loaded_text.lower()

    missing = str(tmp_path / "no-such-model.gguf")
    failed_load(qtbot, services, missing)
    assert services.settings.model_path is None
    assert Settings.load().model_path is None  # the next start and "Restart engine" load what worked
    assert missing not in Settings.load().recent_models
    assert window.engine_status.model_label.text() == loaded_text  # names the model actually loaded
    assert "Built-in" in window.model_picker.button.text()
    assert window.models.failure_box.informativeText() == "The built-in model is still loaded."
    assert window.send_button.isEnabled()
    assert reply(qtbot, window, "The capital of France is") == "complete"
    assert services.store.messages(window.chat.conversation_id)[-1].content

    with qtbot.waitSignal(services.client.sig_loaded, timeout=LOAD_TIMEOUT) as loaded:
        window.engine_status.restart()  # "Restart engine" loads what worked, not the bad path
    assert loaded.args[0].model.is_default_model


def test_the_failed_load_dialog_offers_another_file_or_the_built_in_model(qtbot, services, tmp_path, monkeypatch):
    mtp_model = str(synth("glm4moe").path())
    services.settings.model_path = mtp_model
    start_and_load(qtbot, services)
    window = services.window
    assert window.engine_status.model_label.text().startswith(window.models.model.path.split("/")[-1])

    message = failed_load(qtbot, services, str(tmp_path / "missing.gguf"))
    box = window.models.failure_box
    assert box is not None and box.isVisible()
    assert box.text() == message
    assert "still loaded" in box.informativeText()
    assert {"Choose another file…", "Use the built-in model", "Keep combined.gguf"} == set(buttons(box))
    assert Settings.load().model_path == mtp_model
    assert window.engine_status.model_label.text() == model_text(window.models.model)

    # "Choose another file…": a file dialog, then the load sheet for the chosen file
    monkeypatch.setattr("app.model_controller.QFileDialog.getOpenFileName", lambda *_a: (mtp_model, ""))
    next(b for b in box.buttons() if b.text() == "Choose another file…").click()
    sheet = window.models.sheet
    assert sheet is not None and sheet.choice.path == mtp_model
    qtbot.waitUntil(sheet.load_button.isEnabled, timeout=10000)
    sheet.close()

    # "Use the built-in model": loads it, and only then remembers it
    failed_load(qtbot, services, str(tmp_path / "missing-again.gguf"))
    box = window.models.failure_box
    with qtbot.waitSignal(services.client.sig_loaded, timeout=LOAD_TIMEOUT) as loaded:
        next(b for b in box.buttons() if b.text() == "Use the built-in model").click()
    assert loaded.args[0].model.is_default_model
    assert Settings.load().model_path is None
    assert Settings.load().recent_models == [mtp_model]
    assert "Built-in" in window.model_picker.button.text()


def test_send_is_disabled_with_a_reason_when_no_model_is_loaded_and_stores_nothing(qtbot, services, tmp_path):
    services.settings.model_path = str(tmp_path / "deleted-since-last-time.gguf")
    with qtbot.waitSignal(services.client.sig_error, timeout=LOAD_TIMEOUT, check_params_cb=lambda ev: ev.final):
        services.start()
    window = services.window
    assert window.engine_status.model_label.text() == "No model loaded"
    assert "No model is loaded now" in window.models.failure_box.informativeText()
    assert not window.send_button.isEnabled()
    assert "No model is loaded" in window.send_button.toolTip()
    assert window.chat_pane.blocked_label.isVisibleTo(window) and "choose one" in window.chat_pane.blocked_label.text()
    assert not window.chat_pane.regen_button.isEnabled()

    conv = window.chat.new_conversation()
    window.composer.setPlainText("Hello?")
    window.composer.sig_submit.emit()  # Enter reaches send() even with the button disabled
    qtbot.wait(500)
    assert services.store.messages(conv) == []  # no empty "failed" reply
    assert window.composer.toPlainText() == "Hello?"  # the text is kept for when a model is loaded
    assert "No model is loaded" in window.statusBar().currentMessage()

    with qtbot.waitSignal(services.client.sig_loaded, timeout=LOAD_TIMEOUT):
        window.models.use_default_model()
    assert window.send_button.isEnabled() and not window.chat_pane.blocked_label.isVisibleTo(window)


def test_the_load_sheet_loads_with_the_chosen_context_and_threads_and_eject_unloads(qtbot, services):
    start_and_load(qtbot, services)
    window = services.window
    assert window.models.model.n_ctx == 512
    assert window.models_page.library.ctx.value() == 512  # the Models page estimates at the chat's context
    window.model_picker.sig_pick.emit(None)  # the picker's "Built-in" entry opens the sheet
    sheet = window.models.sheet
    qtbot.waitUntil(lambda: sheet.plan is not None, timeout=20000)
    assert sheet.ctx.value() == 512 and sheet.threads.value() == 1  # what the chat uses now
    small = sheet.plan.estimate
    assert small.kv_cache > 0 and sheet.ram_bar.value() > 0 and "fits" in sheet.memory_text.text()

    sheet.ctx.setValue(1024)  # the estimate follows the context the chat will use
    qtbot.waitUntil(lambda: sheet.plan.estimate.kv_cache == 2 * small.kv_cache, timeout=20000)
    assert "1,024 tokens" in sheet.memory_text.text()
    with qtbot.waitSignal(services.client.sig_loaded, timeout=LOAD_TIMEOUT) as loaded:
        sheet.load_button.click()
    assert (loaded.args[0].model.n_ctx, loaded.args[0].model.n_threads) == (1024, 1)
    assert Settings.load().n_ctx == 1024 and window.chat.context_size == 1024
    assert window.models_page.library.ctx.value() == 1024

    sheet = window.models.open_sheet(None)
    assert sheet.eject_button.isEnabled()
    with qtbot.waitSignal(services.client.sig_unloaded, timeout=LOAD_TIMEOUT):
        sheet.eject_button.click()
    assert window.engine_status.model_label.text() == "No model loaded"
    assert "No model loaded" in window.model_picker.button.text()
    assert not window.send_button.isEnabled()
    assert "Eject (unload the model)" not in window.model_picker.actions_text()


def test_gpu_layers_are_disabled_with_a_reason_on_a_cpu_build(qtbot, services):
    start_and_load(qtbot, services)
    assert services.client.engine.backend == "cpu"  # this test machine's build
    sheet = services.window.models.open_sheet(None)
    assert not sheet.gpu_layers.isEnabled()
    assert "CPU-only" in sheet.gpu_reason.text() and "engine build --backend" in sheet.gpu_reason.text()
    assert sheet.gpu_reason.isVisibleTo(sheet)
    assert sheet.current_choice().n_gpu_layers == 0
    assert gpu_offload_reason("cuda") == "" and gpu_offload_reason(None)
    sheet.close()


def test_the_picker_lists_recent_models_the_built_in_one_and_open(qtbot, services):
    mtp_model = str(synth("glm4moe").path())
    services.settings.model_path = mtp_model
    start_and_load(qtbot, services)
    entries = services.window.model_picker.actions_text()
    assert entries[0] == mtp_model.split("/")[-1]
    assert "Built-in: Gemma 3 270M" in entries and "Open a GGUF file…" in entries
    assert services.settings.recent_models == [mtp_model]


def test_the_load_sheet_reads_the_header_and_estimates_off_the_gui_thread(qtbot, services, monkeypatch):
    import engine.gguf.facts
    import engine.store.fit

    seen: list[tuple[str, bool]] = []
    for module, name in ((engine.gguf.facts, "read_facts"), (engine.store.fit, "estimate")):
        original = getattr(module, name)

        def recorder(*args: Any, _original: Any = original, _name: str = name, **kwargs: Any) -> Any:
            seen.append((_name, threading.current_thread() is threading.main_thread()))
            return _original(*args, **kwargs)

        monkeypatch.setattr(module, name, recorder)
    start_and_load(qtbot, services)
    sheet = services.window.models.open_sheet(str(synth("glm4moe").path()))
    qtbot.waitUntil(lambda: sheet.plan is not None, timeout=20000)
    sheet.ctx.setValue(768)
    qtbot.waitUntil(lambda: sheet.plan is not None and "768 tokens" in sheet.memory_text.text(), timeout=20000)
    assert sheet.mtp.isEnabled()  # the synthetic model has an MTP head
    assert {"read_facts", "estimate"} <= {name for name, _ in seen}
    assert not [name for name, on_gui in seen if on_gui]
    sheet.close()


def test_offloaded_layers_move_their_share_of_the_estimate_to_the_gpu():
    path = str(synth("glm4moe").path())
    on_cpu = plan_memory(path, 512, None, True, 0.0, None)
    assert on_cpu.vram_need == 0 and on_cpu.ram_need == on_cpu.estimate.total
    half = plan_memory(path, 512, None, True, 0.5, 8 * 2**30)
    assert 0 < half.vram_need < half.estimate.total and half.ram_need + half.vram_need == half.estimate.total
    report = HardwareReport(os="Linux", machine="x86_64", cpu_model="", cpu_flags=[], cores=8, ram_mib=None,
                            engine_devices=[EngineDevice("CPU", "", "cpu", 64000, 64000),
                                            EngineDevice("Vulkan0", "", "gpu", 20000, 24000)],
                            gpus=[GPU("nvidia", "RTX", memory_mib=24000)])
    no_gpu = HardwareReport(os="Linux", machine="x86_64", cpu_model="", cpu_flags=[], cores=8, ram_mib=None)
    assert vram_from_report(report) == 24000 * 2**20 and vram_from_report(no_gpu) is None


def test_a_setting_the_load_refused_is_put_back_to_what_loaded(qtbot, services):
    start_and_load(qtbot, services)
    services.settings.n_ctx = 2**25  # as Preferences or a hand-edited file might leave it: past the limit
    with qtbot.waitSignal(services.client.sig_error, timeout=LOAD_TIMEOUT, check_params_cb=lambda ev: ev.final):
        services.window.models.load()
    assert services.settings.n_ctx == 512 and Settings.load().n_ctx == 512
    assert services.window.models.model is not None and services.window.send_button.isEnabled()


def test_the_load_sheet_estimates_a_sliding_window_cache_as_the_preference_keeps_it(qtbot, services):
    """The built-in Gemma 3 keeps its windowed layers' window only unless Preferences keep the whole cache:
    the sheet's estimate counts the cache the load will make."""
    from engine.default_model import default_model_path
    from engine.store import fit

    start_and_load(qtbot, services)
    path = str(default_model_path())
    window_only = fit.estimate(path, n_ctx=8192, mtp=False).kv_cache
    whole = fit.estimate(path, n_ctx=8192, mtp=False, swa_full=True).kv_cache
    assert whole > 2 * window_only
    for swa_full, kv_cache in ((False, window_only), (True, whole)):
        services.settings.swa_full = swa_full
        services.window.model_picker.sig_pick.emit(None)
        sheet = services.window.models.sheet
        sheet.ctx.setValue(8192)
        qtbot.waitUntil(lambda s=sheet, kv=kv_cache: s.plan is not None and s.plan.estimate.kv_cache == kv,
                        timeout=20000)
        sheet.close()
