"""How fast can a reply stream into the chat window, and does the GUI stay
responsive? Streams a long reply from a tiny synthetic model (thousands of
tokens per second) into the real main window and measures:

- tokens per second as the window received them, and
- the longest event-loop stall: a 5 ms timer records the largest gap
  between its ticks while the reply streams (goal: under 30 ms).

    QT_QPA_PLATFORM=offscreen .venv/bin/python scripts/stream_bench.py [--tokens 3000] [--mtp]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

tmp = tempfile.mkdtemp(prefix="mtp-studio-stream-")
os.environ["MTP_STUDIO_DATA_DIR"] = str(Path(tmp) / "data")
os.environ["MTP_STUDIO_CONFIG_DIR"] = str(Path(tmp) / "config")

from PySide6.QtCore import QElapsedTimer, QEventLoop, QTimer  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=3000)
    parser.add_argument("--mtp", action="store_true", help="draft with the model's MTP head")
    args = parser.parse_args()
    _app = QApplication(sys.argv[:1])  # kept alive for the whole run
    from app.application import Services
    from engine.synth import HeadMap, SynthModel, SynthSpec

    model = SynthModel(SynthSpec(arch="glm4moe", weights="oracle", heads=(HeadMap("token", 0.8),)))
    services = Services()
    services.settings.model_path = str(model.path())
    services.settings.max_tokens = args.tokens
    services.settings.speculative = "mtp" if args.mtp else "off"
    # greedy and no penalty, as before presets existed: the same reply every run, so runs compare
    services.settings.sampling = replace(services.settings.sampling, temperature=0.0, repeat_penalty=1.0)
    win = services.window
    win.resize(1280, 800)

    loop = QEventLoop()
    services.client.sig_loaded.connect(loop.quit)
    services.start()
    loop.exec()

    tokens = {"n": 0, "first": 0.0, "last": 0.0}

    def on_token(_event: object) -> None:
        now = time.perf_counter()
        if not tokens["n"]:
            tokens["first"] = now
        tokens["n"] += 1
        tokens["last"] = now

    services.client.sig_token.connect(on_token)
    clock = QElapsedTimer()
    gaps: list[int] = []
    ticker = QTimer()
    ticker.setInterval(5)

    def tick() -> None:
        gaps.append(clock.restart())

    ticker.timeout.connect(tick)
    done = QEventLoop()
    win.chat.sig_reply_finished.connect(done.quit)
    win.composer.setPlainText(" the river model")
    clock.start()
    ticker.start()
    win.send()
    done.exec()
    ticker.stop()
    span = tokens["last"] - tokens["first"]
    stats = win.chat.stream.last_stats
    generated = stats.generated_tokens if stats else 0
    decode = (stats.decode_tps if stats else None) or 0
    print(f"streamed {generated} tokens in {tokens['n']} token events over {span:.2f} s: "
          f"{generated / span:.0f} tok/s into the window (engine decode {decode:.0f} tok/s)")
    worst = sorted(gaps)[-3:]
    print(f"event loop: longest stall {max(gaps)} ms (next {worst[:-1]}), {len(gaps)} ticks, "
          f"{sum(g > 30 for g in gaps)} gaps over 30 ms; transcript flushes {win.transcript.flushes}")
    services.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
