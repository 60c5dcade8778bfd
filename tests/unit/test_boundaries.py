"""The two firm rules of the architecture: engine never imports Qt, and only
the worker (engine.runtime) loads llama.cpp — never the GUI process. And the
app reaches the engine only through the modules named here; no two modules
import each other, even through others; and every import runs down the
layers of docs/architecture.md (LAYERS)."""

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
    "engine.unicode_text": "which field of a request holds text that is not Unicode (the client names it)",
    "engine.paths": "data and config folders",
    "engine.default_model": "its description",
    "engine.gguf.facts": "header facts, read without llama.cpp",
    "engine.hardware": "default_threads",
    "engine.hardware.probe": "HardwareReport: the hardware probe's JSON, typed (probed in a child, never here)",
    "engine.hardware.recommend": "which engine build fits the report, in words",
    "engine.store.credentials": "the hub token (keyring, off the GUI thread)",
    "engine.store.fit": "memory estimates from headers",
    "engine.store.hub": "search and file lists",
    "engine.store.catalog": "the catalog of known MTP families (recommended models)",
    "engine.store.library": "models on disk",
    "engine.store.doctor": "the sidecar doctor",
    "engine.store.projectors": "the projector doctor: does a vision projector fit its target (headers only)",
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


# The layers, lowest first (docs/architecture.md). A module imports from its own package
# and from lower layers only; packages on one layer are peers and never import each other.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("engine", "engine.errors", "engine.paths", "engine.netaddr", "engine.unicode_text", "engine.frozen",
     "engine.build_record", "engine.sampling"),  # plain Python, no engine below
    ("engine.default_model", "engine.gguf", "engine.rpc"),  # the built-in model; the GGUF file; ggml RPC
    ("engine.runtime",),  # the only llama_cpp user
    ("engine.speculative", "engine.synth", "engine.store", "engine.hardware", "engine.load_options"),
    ("engine.generation",),  # the decode loop and a loaded model
    ("engine.worker",),  # the process that owns the Session
    ("engine.autotune",),  # measures candidates through the generator; its profiles are read above
    ("engine.server",),  # one more client of the worker
    ("engine.bench",),  # measures everything below it, the server included
    ("engine.cli",),  # the commands
    ("engine.__main__",),  # python -m engine
    ("app",),  # the GUI process, above the whole engine
)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for top in ("engine", "app") for p in (ROOT / top).rglob("*.py")}


def _type_only(tree: ast.AST) -> set[int]:
    """The ids of the nodes under ``if TYPE_CHECKING:`` (imports for annotations, never run)."""
    return {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
            and (getattr(node.test, "id", None) or getattr(node.test, "attr", None)) == "TYPE_CHECKING"
            for stmt in node.body for n in ast.walk(stmt)}


def _import_graph(modules: dict[str, Path], annotations: bool = True) -> dict[str, set[str]]:
    """Module -> the project modules it imports, at the top or in a function alike, and under
    ``if TYPE_CHECKING:`` too unless ``annotations`` is False (``from engine.store import fit`` is
    ``engine.store.fit``; ``from engine.rpc import parse_endpoints`` is the package ``engine.rpc``)."""
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found: set[str] = set()
        tree = ast.parse(path.read_text())
        skip = set() if annotations else _type_only(tree)
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the module's own package up
                    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                    base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    found.add(sub if sub in modules else base)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every set of modules that import each other, directly or round a loop (Tarjan's strongly
    connected components of more than one module)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while component[-1:] != [v]:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _layer_of(module: str) -> tuple[int, str]:
    """(layer, package) of a module: the longest name in LAYERS it is or lies under."""
    best = (-1, "")
    for i, layer in enumerate(LAYERS):
        for package in layer:
            if (module == package or module.startswith(package + ".")) and len(package) > len(best[1]):
                best = (i, package)
    return best


def _upward(graph: dict[str, set[str]]) -> list[str]:
    """Imports that go up a layer, or sideways to a peer package on the same layer."""
    wrong = []
    for module, imported in sorted(graph.items()):
        (mine, package) = _layer_of(module)
        for other in sorted(imported):
            (theirs, their_package) = _layer_of(other)
            if their_package != package and theirs >= mine:
                wrong.append(f"{module} -> {other}")
    return wrong


def test_no_two_modules_import_each_other():
    # a type-only back reference (``if TYPE_CHECKING:``) never runs, so it closes no circle;
    # the layer rule below still counts it
    assert _circles(_import_graph(_modules(), annotations=False)) == []


def test_the_circle_finder_finds_a_loop_through_three_modules():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
    assert _circles(graph) == [["a", "b", "c"]]


def test_every_module_has_a_layer():
    assert [m for m in _modules() if _layer_of(m)[0] < 0] == []


def test_every_import_runs_down_the_layers():
    assert _upward(_import_graph(_modules())) == []


def test_an_import_up_a_layer_or_to_a_peer_is_caught():
    graph = {"engine.runtime.model": {"engine.generation.session", "engine.errors"},
             "engine.store.fit": {"engine.synth.spec", "engine.store.hub"}}
    assert _upward(graph) == ["engine.runtime.model -> engine.generation.session",
                              "engine.store.fit -> engine.synth.spec"]


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


def test_no_app_module_outgrows_one_concern():
    # issue 29: a module over 350 lines in app/ has been two concerns every time so far (a page and its
    # queue, a view and its HTML, a sheet and its plan); split it by concept rather than raise the limit
    root = Path(__file__).resolve().parents[2] / "app"
    long = {str(p.relative_to(root)): n for p in root.rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > 350}
    assert not long, long
