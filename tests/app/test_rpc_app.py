"""The app with a model split across loopback ggml RPC servers (docs/multi-machine.md):
the Hardware page lists remote devices, a server that dies mid-reply ends the reply
with a clear notice while the app stays up and keeps the conversation, and the
restart reconnects. The real worker, the real servers, offscreen Qt."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.app.conftest import type_and_send
from tests.engine.conftest import synth
from tests.engine.test_rpc import Servers, _free_port, server_binary


@pytest.fixture()
def pool() -> Iterator[Servers]:
    servers = Servers(server_binary(), 2)
    yield servers
    servers.close()


def test_the_hardware_page_lists_remote_devices_and_names_a_dead_one(qtbot, services, pool):
    box = services.window.hardware_page.remote
    dead = f"127.0.0.1:{_free_port()}"
    box.servers.setText(f"{pool.endpoint(0)},{dead}")
    with qtbot.waitSignal(box._proc.sig_finished, timeout=30000):
        box.probe()
    assert box.table.rowCount() == 2
    assert box.table.item(0, 0).text() == pool.endpoint(0) and "MiB free" in box.table.item(0, 2).text()
    assert box.table.item(1, 1).text() == "dead" and "cannot connect" in box.status.text()


def test_a_server_dying_mid_reply_keeps_app_and_conversation_and_the_restart_reconnects(qtbot, services, pool):
    window = services.window
    model = synth("glm4moe", weights="mixed", agree=0.7, reads="hidden")
    services.settings.model_path = str(model.path("combined"))
    services.settings.rpc_servers = ",".join(pool.endpoints)
    services.settings.speculative, services.settings.max_tokens = "mtp", 3000
    with qtbot.waitSignal(services.client.sig_loaded, timeout=60000) as loaded:
        services.start()
    assert any("MTP head" in line for line in loaded.args[0].model.placement), loaded.args[0].model
    notices: list[str] = []
    window.chat.sig_notice.connect(notices.append)
    with qtbot.waitSignal(services.client.sig_token, timeout=60000):
        type_and_send(qtbot, window, " the river")
    with qtbot.waitSignal(services.client.sig_died, timeout=30000):
        pool.kill(1)
    assert any("stopped answering" in n for n in notices), notices
    assert window.banner.isVisible() or not window.isVisible()
    conv = window.chat.conversation_id
    msgs = services.store.messages(conv)
    assert [m.role for m in msgs] == ["user", "assistant"] and msgs[1].content  # the partial reply is kept

    pool.start(1)  # the machine is back: restart the engine from the banner
    with qtbot.waitSignal(services.client.sig_loaded, timeout=60000):
        window.banner.button.click()
    services.settings.max_tokens = 8
    with qtbot.waitSignal(window.chat.sig_reply_finished, timeout=60000) as finished:
        type_and_send(qtbot, window, " the river")
    assert finished.args == ["complete"]
    assert len(services.store.messages(conv)) == 4
