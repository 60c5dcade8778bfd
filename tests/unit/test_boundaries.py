"""The two firm rules of the architecture: engine never imports Qt, and only
the worker (engine.runtime) loads llama.cpp — never the GUI process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_engine_never_imports_qt_or_the_app():
    offenders = [str(p.relative_to(ROOT)) for p in (ROOT / "engine").rglob("*.py")
                 if any(s in p.read_text() for s in ("PySide6", "from app", "import app"))]
    assert offenders == []


def test_only_engine_runtime_imports_llama_cpp():
    offenders = []
    for p in [*(ROOT / "engine").rglob("*.py"), *(ROOT / "app").rglob("*.py")]:
        text = p.read_text()
        if ("import llama_cpp" in text or "from llama_cpp" in text) and "engine/runtime" not in p.as_posix():
            offenders.append(str(p.relative_to(ROOT)))
    assert offenders == []


def test_the_gui_process_does_not_load_llama_cpp():
    code = (
        "import os, sys\n"
        "os.environ['QT_QPA_PLATFORM'] = 'offscreen'\n"
        "from PySide6.QtWidgets import QApplication\n"
        "app = QApplication([])\n"
        "import app.application, app.models_page, app.hardware_page, app.autotune_wizard\n"
        "print('llama_cpp' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.stdout.strip().splitlines()[-1] == "False", out.stderr
