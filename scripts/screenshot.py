"""Screenshots of the main window with a streamed reply, for docs and review.

Run under a real (virtual) screen:

    xvfb-run -a -s "-screen 0 1400x900x24" .venv/bin/python scripts/screenshot.py [OUT_DIR]

It uses a throw-away data folder and an unreachable hub (offline), sends the
copper question to the embedded default model with the default settings
(chat-default.png), regenerates it (chat-versions.png: the reply's versions),
sends a long prompt to a synthetic MTP model (chat-prefill.png: prompt
progress), then a short one (chat-mtp-streaming.png mid-stream, chat-mtp.png),
and saves the load sheet and a failed load that kept the model (load-sheet.png,
failed-load.png), then the hardware page and the models page offline with the
recommended MTP models and their fit badges: hardware.png, models.png.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

tmp = tempfile.mkdtemp(prefix="mtp-studio-shot-")
os.environ["MTP_STUDIO_DATA_DIR"] = str(Path(tmp) / "data")
os.environ["MTP_STUDIO_CONFIG_DIR"] = str(Path(tmp) / "config")
os.environ["HF_ENDPOINT"] = "http://127.0.0.1:9"  # nothing listens there: the app is offline

from PySide6.QtCore import QEventLoop, QTimer  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402


def wait_for(signal, timeout_ms: int) -> None:  # noqa: ANN001
    loop = QEventLoop()
    signal.connect(loop.quit)
    QTimer.singleShot(timeout_ms, loop.quit)
    loop.exec()


def pause(ms: int) -> None:
    loop = QEventLoop()
    QTimer.singleShot(ms, loop.quit)
    loop.exec()


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "screenshots")
    out.mkdir(parents=True, exist_ok=True)
    _app = QApplication(sys.argv[:1])  # kept alive for the whole run
    from app.application import Services
    from engine.synth import HeadMap, SynthModel, SynthSpec

    services = Services()
    win = services.window
    win.resize(1360, 860)
    services.start()
    wait_for(services.client.sig_loaded, 60000)
    win.composer.setPlainText("What are three uses of copper?")
    win.send()
    wait_for(win.chat.sig_reply_finished, 60000)
    pause(300)
    win.grab().save(str(out / "chat-default.png"))
    win.chat_pane.regen_button.click()  # a second version; the first is kept
    wait_for(win.chat.sig_reply_finished, 60000)
    pause(300)
    win.grab().save(str(out / "chat-versions.png"))

    # bench size: slow enough on a CPU (~100 tok/s) to catch the reply mid-stream
    model = SynthModel(SynthSpec(arch="glm4moe", size="bench", dense=True, weights="oracle",
                                 heads=(HeadMap("token", 0.9),)))
    services.settings.model_path = str(model.path("combined"))
    services.settings.max_tokens = 500
    services.settings.speculative = "mtp"
    services.settings.n_max = 4
    win.models.load()
    wait_for(services.client.sig_loaded, 60000)
    win.conversation_list.new_chat()
    win.composer.setPlainText(" the river model" * 180)  # ~2,700 tokens: prefill takes a few seconds
    win.send()
    pause(1200)
    win.grab().save(str(out / "chat-prefill.png"))
    wait_for(win.chat.sig_reply_finished, 120000)
    win.conversation_list.new_chat()
    win.composer.setPlainText(" the river model")
    win.send()
    pause(2500)
    win.grab().save(str(out / "chat-mtp-streaming.png"))
    wait_for(win.chat.sig_reply_finished, 60000)
    pause(300)
    win.grab().save(str(out / "chat-mtp.png"))
    sheet = win.models.open_sheet(services.settings.model_path)  # the load sheet for the loaded MTP model
    pause(1500)
    sheet.grab().save(str(out / "load-sheet.png"))
    sheet.close()
    win.models.use(str(Path(tmp) / "moved-away.gguf"), None)  # a failed load keeps the MTP model
    wait_for(services.client.sig_error, 30000)
    pause(500)
    _app.primaryScreen().grabWindow(0).save(str(out / "failed-load.png"))  # the window and its dialog
    if win.models.failure_box is not None:
        win.models.failure_box.close()
    win.tabs.setCurrentWidget(win.hardware_page)
    for _ in range(100):
        if win.hardware_page.report is not None:
            break
        pause(200)
    win.grab().save(str(out / "hardware.png"))
    win.tabs.setCurrentWidget(win.models_page)
    pause(4000)  # the offline check answers within ~3 s
    page = win.models_page
    for i in range(page.library.count()):
        if "combined" in page.library.item(i).text():
            page.library.setCurrentRow(i)
            break
    pause(300)
    win.grab().save(str(out / "models.png"))
    services.shutdown()
    print(f"saved to {out}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
