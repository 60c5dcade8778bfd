"""The two firm rules of the architecture: engine never imports Qt, and only
the worker (engine.runtime) loads llama.cpp — never the GUI process. And the
app reaches the engine only through the modules named here."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# The engine modules the app may import, and why. Anything that decodes,
# drafts or generates runs in the worker; the app speaks to it through the
# protocol and reads headers, the store and profiles without llama.cpp.
APP_MAY_IMPORT = {
    "engine.worker.protocol": "requests, and the events re-exported from engine.worker.events",
    "engine.worker.events": "typed worker events (ModelInfo, StatsSnapshot in them)",
    "engine.worker.client": "describe_exit: how a child process ended, in words",
    "engine.speculative.settings": "the one speculative-settings type and MAX_DRAFT",
    "engine.sampling": "the sampling-settings type and its presets (no llama.cpp)",
    "engine.speculative.stats": "StatsSnapshot, the statistics the worker sends",
    "engine.speculative.stats_text": "the one statistics formatter",
    "engine.autotune.profiles": "the profile store (lookup off the GUI thread)",
    "engine.autotune.messages": "what autotune --jsonl prints",
    "engine.errors": "error kinds",
    "engine.paths": "data and config folders",
    "engine.default_model": "its description",
    "engine.gguf.facts": "header facts, read without llama.cpp",
    "engine.hardware": "default_threads",
    "engine.store.credentials": "the hub token (keyring, off the GUI thread)",
    "engine.store.fit": "memory estimates from headers",
    "engine.store.hub": "search and file lists",
    "engine.store.catalog": "the catalog of known MTP families (recommended models)",
    "engine.store.library": "models on disk",
    "engine.store.doctor": "the sidecar doctor",
    "engine.store.download": "resumable downloads",
    "engine.store.repair": "sidecar repair (its proof runs in a worker: app/pair_proof.py)",
    "engine.store.sqlite_salvage": "rows read back from a damaged conversations database (sqlite3 .recover)",
    "engine.cli": "the headless commands, when mtp-studio gets one",
    "engine.frozen": "the packaged app runs its own children (-m/-c), before any Qt import",
    "engine.build_record": "the engine build record for --version and the About box (a JSON file, no llama.cpp)",
    # the local server (issue 15): a client of the worker, never llama.cpp; the panel runs it on a thread
    "engine.server.engine_link": "the EngineLink interface app/server_link.py implements over the chat's worker",
    "engine.server.runner": "runs the OpenAI-compatible server on a thread with its own asyncio loop",
    "engine.server.config": "the server's settings and the checks before it binds",
    "engine.server.api_key": "the server's API key (keyring, made with secrets)",
    "engine.server.metrics": "the request records the panel's log shows",
}
APP_MUST_NOT_IMPORT = ("engine.runtime", "engine.generation", "engine.speculative.mtp", "engine.speculative.drafter",
                       "engine.speculative.rollback", "engine.worker.server", "engine.autotune.search",
                       "engine.bench", "engine.synth")


def _engine_imports(path: Path) -> set[str]:
    """Every engine module a file imports (``from engine.store import fit`` counts as ``engine.store.fit``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "engine":
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                is_module = (ROOT / (sub.replace(".", "/") + ".py")).exists() or (ROOT / sub.replace(".", "/")).is_dir()
                found.add(sub if is_module else node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "engine")
    return found


def test_the_app_imports_only_the_engine_modules_it_is_allowed():
    used = {str(p.relative_to(ROOT)): _engine_imports(p) for p in (ROOT / "app").rglob("*.py")}
    unlisted = {f: sorted(m - set(APP_MAY_IMPORT)) for f, m in used.items() if m - set(APP_MAY_IMPORT)}
    assert unlisted == {}
    forbidden = {f: sorted(m for m in mods if m.startswith(APP_MUST_NOT_IMPORT)) for f, mods in used.items()}
    assert {f: m for f, m in forbidden.items() if m} == {}
    assert not set(APP_MAY_IMPORT) & set(APP_MUST_NOT_IMPORT)


def test_only_the_process_wrapper_starts_child_processes_in_the_app():
    offenders = [str(p.relative_to(ROOT)) for p in (ROOT / "app").rglob("*.py")
                 if p.name != "process.py" and any(s in p.read_text() for s in ("QProcess(", "subprocess."))]
    assert offenders == []


def test_the_app_reads_worker_events_by_attribute_never_by_key():
    offenders = [str(p.relative_to(ROOT)) for p in (ROOT / "app").rglob("*.py")
                 if any(s in p.read_text() for s in ('ev["', "ev['", 'event["', "event['", 'stats["', "stats.get("))]
    assert offenders == []


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
        "import app.application, app.models_page, app.hardware_page, app.autotune_wizard, app.pair_proof\n"
        "print('llama_cpp' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.stdout.strip().splitlines()[-1] == "False", out.stderr
