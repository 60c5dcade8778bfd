"""Failures a hostile user found (issue 17): a conversation longer than the
context, a second app instance on the same data folder, text that is not
valid Unicode, and a reference driver that prints bytes that are not UTF-8."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from app.chat.store import ConversationStore
from engine.worker.events import ErrorEvent
from tests.app.conftest import start_and_load, type_and_send

# About 70 tokens of the default model's vocabulary per message.
LONG = ("The river runs past the old mill and the bridge, under the willows, through the fields of wheat "
        "and barley, and on to the sea where the boats come in at dusk with their nets full of fish. ")


@pytest.fixture()
def warnings(monkeypatch) -> list[tuple[str, str]]:
    """The failed-load dialogs the model controller opens (title, text), recorded instead of shown."""
    shown: list[tuple[str, str]] = []
    monkeypatch.setattr("app.model_controller.QMessageBox.open",
                        lambda box: shown.append((box.windowTitle(), box.text())))
    return shown


def reply(qtbot, window, text: str) -> str:
    with qtbot.waitSignal(window.chat.sig_reply_finished, timeout=90000) as finished:
        type_and_send(qtbot, window, text, paste=True)
    return finished.args[0]


# -- item 7: a conversation longer than the context ------------------------------
def test_a_generation_error_is_not_a_load_error(services, warnings):
    status = services.window.engine_status
    status.model_label.setText("gemma.gguf · no MTP")
    services.client.sig_error.emit(ErrorEvent("q7", "context", "The prompt has 300 tokens; the context holds 256.",
                                              final=False))
    assert warnings == []
    assert status.model_label.text() == "gemma.gguf · no MTP"
    services.client.sig_error.emit(ErrorEvent("q8", "context", "n_ctx must be positive", final=True))
    assert warnings == [("Could not load the model", "n_ctx must be positive")]
    assert status.model_label.text() == "No model loaded"


def test_a_conversation_longer_than_the_context_keeps_its_newest_turns(qtbot, services, warnings):
    services.settings.n_ctx = 256
    services.settings.max_tokens = 6
    start_and_load(qtbot, services)
    window, store = services.window, services.store
    model_text = window.engine_status.model_label.text()
    conv = window.chat.new_conversation()
    for i in range(12):
        store.add_message(conv, "user" if i % 2 == 0 else "assistant", f"{i}. {LONG}")
    window.chat.open(conv)

    assert reply(qtbot, window, "The capital of France is") == "complete"
    assert warnings == []
    assert window.engine_status.model_label.text() == model_text
    notice = window.chat_pane.context_notice
    assert notice.isVisibleTo(window) and "256-token context" in notice.text()
    assert "oldest" in notice.text() and "left out of this reply" in notice.text()
    assert store.messages(conv)[-1].status == "complete" and store.messages(conv)[-1].content

    assert reply(qtbot, window, "And the capital of Italy is") == "complete"  # later messages work too
    assert warnings == []


def test_a_message_longer_than_the_context_says_what_to_do_and_the_chat_goes_on(qtbot, services, warnings):
    services.settings.n_ctx = 256
    services.settings.max_tokens = 6
    start_and_load(qtbot, services)
    window = services.window
    model_text = window.engine_status.model_label.text()

    assert reply(qtbot, window, LONG * 6) == "error"
    assert warnings == []
    assert window.engine_status.model_label.text() == model_text
    text = window.chat_pane.context_notice.text()
    assert "256-token context" in text and "Context size" in text and "shorten" in text

    assert reply(qtbot, window, "The capital of France is") == "complete"  # the long message is left out
    assert "left out" in window.chat_pane.context_notice.text()


def test_a_message_with_a_lone_surrogate_stays_in_the_composer_and_the_next_one_is_answered(qtbot, services,
                                                                                            warnings):
    # a broken paste can put a lone surrogate in the composer: SQLite and the worker's pipe both refused
    # it with an exception inside Qt (issue 31); now the message is not sent and the chat says why
    services.settings.max_tokens = 4
    start_and_load(qtbot, services)
    window, chat = services.window, services.window.chat
    window.composer.setPlainText("Tell me about \ud800 the river.")
    if "\ud800" not in window.composer.toPlainText():  # Qt may have replaced it already: send it directly
        assert not chat.send("Tell me about \ud800 the river.")
    else:
        window.send()
        assert "\ud800" in window.composer.toPlainText()  # left for the user to fix
    assert "not valid text" in window.statusBar().currentMessage()
    assert not chat.busy
    stored = services.store.messages(chat.conversation_id) if chat.conversation_id is not None else []
    assert stored == []  # nothing half-written
    assert reply(qtbot, window, "The capital of France is") == "complete"
    assert warnings == []


# -- item 9: a second app instance ------------------------------------------------
def streaming_reply(store: ConversationStore) -> tuple[int, int]:
    """A reply the first instance is streaming right now."""
    conv = store.create("Live")
    store.add_message(conv.id, "user", "Once upon a time")
    return conv.id, store.add_message(conv.id, "assistant", "there was", status="streaming").id


def test_a_second_instance_in_one_process_is_refused_before_it_touches_the_conversations(services):
    from app.application import AlreadyRunning, Services

    conv, _ = streaming_reply(services.store)
    second = None
    with pytest.raises(AlreadyRunning, match="already running"):
        second = Services()
    if second is not None:  # before the guard existed: clean up what it started
        second.store.close()
    assert services.store.messages(conv)[-1].status == "streaming"


def test_a_second_app_process_raises_the_first_window_and_exits(qtbot, services):
    conv, _ = streaming_reply(services.store)
    raised: list[bool] = []
    services.instance.sig_raise_requested.connect(lambda: raised.append(True))
    proc = subprocess.Popen([sys.executable, "-m", "app.main"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True, env={**os.environ, "QT_QPA_PLATFORM": "offscreen"})
    try:
        qtbot.waitUntil(lambda: proc.poll() is not None, timeout=60000)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    output = proc.stdout.read().decode() if proc.stdout else ""
    assert proc.returncode == 0, output
    assert "already running" in output
    qtbot.waitUntil(lambda: bool(raised), timeout=10000)
    assert services.store.messages(conv)[-1].status == "streaming"


def test_a_lock_left_by_a_killed_app_does_not_block_the_next_start(tmp_path, monkeypatch, qtbot):
    data = tmp_path / "data"
    data.mkdir()
    monkeypatch.setenv("MTP_STUDIO_DATA_DIR", str(data))
    monkeypatch.setenv("MTP_STUDIO_CONFIG_DIR", str(tmp_path / "config"))
    from app.application import InstanceGuard, Services

    code = ("import os, sys; from PySide6.QtCore import QLockFile; lock = QLockFile(sys.argv[1]); "
            "assert lock.tryLock(0); os.kill(os.getpid(), 9)")
    subprocess.run([sys.executable, "-c", code, str(InstanceGuard.lock_path(data))], check=False)
    assert InstanceGuard.lock_path(data).exists()
    s = Services()
    qtbot.addWidget(s.window)
    s.shutdown()


# -- item 10 -----------------------------------------------------------------------
def test_text_that_is_not_valid_unicode_is_stored_not_refused(tmp_path):
    store = ConversationStore(tmp_path / "c.sqlite3")
    try:
        conv = store.create("bad \udc80 title", system_prompt="sys \ud800")
        msg = store.add_message(conv.id, "user", "lone \ud800 surrogate, a pair \ud83d\ude00")
        assert msg.content == "lone \ufffd surrogate, a pair \U0001f600"
        store.update_message(msg.id, content="still \udfff")
        store.update(conv.id, title="t \ud800")
        assert store.messages(conv.id)[0].content == "still \ufffd"
        assert store.get(conv.id).title == "t \ufffd" and store.get(conv.id).system_prompt == "sys \ufffd"
        assert [c.id for c in store.list("\ud800")] == [conv.id]  # a search for it finds what was stored
    finally:
        store.close()


def test_the_reference_driver_log_may_hold_bytes_that_are_not_utf8(tmp_path):
    from engine.bench import reference

    driver = tmp_path / "llama-speculative-simple"
    driver.write_text("#!/bin/sh\nprintf 'piece \\377\\376 cut\\ndecoded 10 tokens in 0.5 seconds\\n"
                      "n_drafted = 4\\nn_accept = 2\\n' >&2\n")
    driver.chmod(0o755)
    run = reference.run_driver(driver, Path("m.gguf"), "p", 10, 3, 1)
    assert (run.n_drafted, run.n_accept, run.tokens) == (4, 2, 10)


def test_a_request_the_workers_pipe_cannot_carry_ends_with_an_error_and_the_engine_keeps_working(qtbot, services,
                                                                                               warnings):
    # the last guard behind the fields' checks: a lone surrogate in a request once raised
    # UnicodeEncodeError out of EngineClient._write, inside Qt, and left the engine "generating…" (issue 31)
    from engine.speculative.settings import SPECULATION_OFF

    start_and_load(qtbot, services)
    client, errors, done = services.client, [], []
    client.sig_error.connect(errors.append)
    client.sig_done.connect(done.append)
    rid = client.generate(messages=[{"role": "user", "content": "Tell me about \ud800 the river."}],
                          speculative=SPECULATION_OFF, max_tokens=4)
    qtbot.waitUntil(lambda: any(ev.id == rid for ev in done), timeout=5000)
    assert [ev.finish_reason for ev in done if ev.id == rid] == ["error"]
    mine = [ev for ev in errors if ev.id == rid]
    assert len(mine) == 1 and not mine[0].final
    assert "messages[0].content" in mine[0].message and "not valid text" in mine[0].message
    assert client.state == "ready" and warnings == []
    assert reply(qtbot, services.window, "The capital of France is") == "complete"  # the worker never saw it


def test_a_model_whose_file_name_is_not_utf8_is_refused_with_a_message_and_the_model_loaded_stays(
        qtbot, services, warnings, default_model, tmp_path):
    # Python reads a file name that is not UTF-8 with its bytes as lone surrogates (os.fsdecode): the
    # load request holding it could not be written to the worker's pipe and raised inside Qt
    start_and_load(qtbot, services)
    window = services.window
    model_text = window.engine_status.model_label.text()
    folder = tmp_path / "models"
    folder.mkdir()
    raw = os.fsencode(folder) + b"/river-\xff.gguf"
    os.symlink(os.fsencode(default_model), raw)
    path = str(folder / os.fsdecode(b"river-\xff.gguf"))
    assert os.path.exists(path) and "\udcff" in path
    window.models.use(path, None)
    qtbot.waitUntil(lambda: bool(warnings), timeout=5000)
    title, text = warnings[0]
    assert title == "Could not load the model" and "river-\\udcff.gguf" in text and "Rename" in text, text
    assert services.client.state == "ready"
    assert window.engine_status.model_label.text() == model_text  # the model loaded before is still there
    assert reply(qtbot, window, "The capital of France is") == "complete"


def _worker_of(app_pid: int) -> int | None:
    """The engine worker among the app's children (the hardware probe is another), by its command line."""
    try:
        children = Path(f"/proc/{app_pid}/task/{app_pid}/children").read_text().split()
    except OSError:
        return None
    for child in children:
        try:
            if b"engine.worker" in Path(f"/proc/{child}/cmdline").read_bytes():
                return int(child)
        except OSError:
            continue
    return None


def _holds_a_model(pid: int) -> bool:
    try:
        return ".gguf" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="finds the app's worker through /proc (Linux)")
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_the_worker_is_gone_within_5_s_of_the_real_app_being_killed(qtbot, tmp_path, sig):
    # issue 31: killed, the app left its worker running with the whole model in memory (3 of 3); this is
    # the real app (python -m app.main), its worker started by QProcess with stderr a pipe to the app
    from tests.engine.test_worker_lifetime import GONE_WITHIN_S, gone_within, running

    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "MTP_STUDIO_DATA_DIR": str(tmp_path / "data"),
           "MTP_STUDIO_CONFIG_DIR": str(tmp_path / "config")}
    app = subprocess.Popen([sys.executable, "-m", "app.main"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           start_new_session=True, env=env)
    worker = None
    try:
        qtbot.waitUntil(lambda: (w := _worker_of(app.pid)) is not None and _holds_a_model(w), timeout=120000)
        worker = _worker_of(app.pid)
        assert worker is not None
        app.send_signal(sig)
        app.wait(20)
        assert gone_within(worker, GONE_WITHIN_S), f"the worker {worker} outlived the app by {GONE_WITHIN_S} s"
    finally:
        if app.poll() is None:
            os.killpg(app.pid, signal.SIGKILL)
            app.wait()
        if worker is not None and running(worker):
            os.kill(worker, signal.SIGKILL)
