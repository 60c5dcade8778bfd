"""Nothing slow runs on the GUI thread: header reads, the memory fit, the
doctor, keyring access and model hashing go through app/background.py.

Each slow function is wrapped to record the thread that called it; the pages
are driven through their widgets, and every call must have come from a pool
thread.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from typing import Any

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QListWidgetItem

from app.autotune_setup import ModelPage
from app.models_page import ModelsPage
from app.settings import Settings
from tests.app.conftest import start_and_load
from tests.engine.conftest import synth

SLOW = [
    ("engine.gguf.facts", "read_facts"),  # a GGUF header, possibly on a slow or network disk
    ("engine.store.fit", "estimate"),
    ("app.models.pair_panel", "diagnose"),  # the sidecar doctor
    ("engine.store.credentials", "set_token"),  # the system keyring may wait on a desktop service
    ("engine.store.credentials", "get_token"),
    ("engine.autotune.profiles", "model_identity"),  # hashes 16 MiB of the model file
]
STUBBED = {"set_token": lambda _token: False, "get_token": lambda: None}  # never the real keyring


@pytest.fixture()
def slow_calls(monkeypatch) -> list[tuple[str, bool]]:
    """(function, called on the GUI thread?) for every call of a slow function."""
    seen: list[tuple[str, bool]] = []
    for module_name, name in SLOW:
        module = importlib.import_module(module_name)
        original: Callable[..., Any] = STUBBED.get(name, getattr(module, name))

        def recorder(*args: Any, _original: Callable[..., Any] = original, _name: str = name,
                     **kwargs: Any) -> Any:
            seen.append((_name, threading.current_thread() is threading.main_thread()))
            return _original(*args, **kwargs)

        monkeypatch.setattr(module, name, recorder)
    return seen


def called(seen: list[tuple[str, bool]]) -> set[str]:
    return {name for name, _ in seen}


def test_the_models_page_reads_headers_runs_the_doctor_and_saves_tokens_off_the_gui_thread(
        qtbot, isolated_dirs, tmp_path, monkeypatch, slow_calls):
    monkeypatch.setenv("MTP_STUDIO_DATA_DIR", str(tmp_path / "data"))
    model = synth("glm4moe")
    page = ModelsPage()
    qtbot.addWidget(page)
    item = QListWidgetItem("trunk")
    item.setData(Qt.ItemDataRole.UserRole, str(model.path("trunk")))
    page.library.entries.addItem(item)
    page.library.entries.setCurrentRow(0)
    qtbot.waitUntil(lambda: "memory at n_ctx 8192" in page.library.facts.toPlainText(), timeout=10000)
    page.library.ctx.setValue(4096)  # each spin of the context box reads the header again
    qtbot.waitUntil(lambda: "memory at n_ctx 4096" in page.library.facts.toPlainText(), timeout=10000)
    page.pair.target_path, page.pair.sidecar_path = str(model.path("trunk")), str(model.path("sidecar-relative"))
    page.pair.doctor_button.click()
    qtbot.waitUntil(lambda: "Repair can fix it" in page.library.facts.toPlainText(), timeout=10000)
    page.hub.token.setText("hf_secret")
    page.hub.save_token()
    qtbot.waitUntil(lambda: "HF_TOKEN" in page.hub.token.placeholderText(), timeout=10000)  # the stub has no keyring
    assert {"read_facts", "estimate", "diagnose", "set_token"} <= called(slow_calls)
    assert not [name for name, on_gui in slow_calls if on_gui]


def test_the_autotune_wizard_reads_the_model_header_off_the_gui_thread(qtbot, slow_calls):
    page = ModelPage(Settings())
    qtbot.addWidget(page)
    page.path.setText(str(synth("glm4moe", "oracle", agree=1.0).path()))
    qtbot.waitUntil(page.isComplete, timeout=10000)
    assert "1 MTP head" in page.facts.text()
    assert "read_facts" in called(slow_calls)
    assert not [name for name, on_gui in slow_calls if on_gui]


def test_the_profile_lookup_hashes_the_model_off_the_gui_thread(qtbot, services, slow_calls):
    services.settings.model_path = str(synth("glm4moe", "oracle", agree=1.0).path())
    services.settings.speculative = "auto"
    start_and_load(qtbot, services)
    # the lookup needs the shared probe's fingerprint; it runs once the report is in
    qtbot.waitUntil(lambda: "model_identity" in called(slow_calls), timeout=60000)
    assert not [name for name, on_gui in slow_calls if on_gui]
