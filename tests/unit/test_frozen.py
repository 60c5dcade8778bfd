"""The packaged app's own command lines: interpreter-style -m/-c, --version, the build record.

The frozen executable is its own worker and tools (engine/frozen.py); these run
the same dispatch in this interpreter. The frozen build itself is checked by
packaging/smoke_frozen.py on the built artifact (docs/installers.md).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine import build_record, frozen

ROOT = Path(__file__).resolve().parents[2]


def test_ordinary_command_lines_are_not_taken_for_the_interpreters():
    assert frozen.run_interpreter_args([]) is None
    assert frozen.run_interpreter_args(["--gui"]) is None
    assert frozen.run_interpreter_args(["info", "model.gguf"]) is None
    assert frozen.run_interpreter_args(["-m"]) is None  # no module named: not ours to run


def test_only_the_apps_own_modules_run_with_dash_m(capsys):
    assert frozen.run_interpreter_args(["-m", "http.server", "8000"]) == 2
    assert "only this application's modules" in capsys.readouterr().err


def test_dash_c_runs_code_with_pythons_argv(monkeypatch):
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    seen: dict = {}
    monkeypatch.setitem(sys.modules, "_frozen_probe", type(sys)("_frozen_probe"))
    sys.modules["_frozen_probe"].seen = seen
    code = "import sys, _frozen_probe; _frozen_probe.seen.update(argv=sys.argv, name=__name__)"
    assert frozen.run_interpreter_args(["-c", code, "a", "b"]) == 0
    assert seen == {"argv": ["-c", "a", "b"], "name": "__main__"}


def test_dash_m_runs_the_module_as_main_and_its_exit_status_comes_through(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    with pytest.raises(SystemExit) as exc:
        frozen.run_interpreter_args(["-m", "engine", "--help"])
    assert exc.value.code == 0
    assert "usage" in capsys.readouterr().out.lower()


def test_a_frozen_main_hands_dash_c_to_the_interpreter_and_a_source_main_does_not():
    """In a child, as the app starts one: the frozen flag decides, nothing else."""
    code = ("import sys; sys.frozen = {frozen}; from app.main import main; "
            "sys.exit(main(['-c', 'print(\\'ran as code\\')']))")
    frozen_run = subprocess.run([sys.executable, "-c", code.format(frozen=True)], capture_output=True, text=True,
                                cwd=ROOT, timeout=120)
    assert frozen_run.returncode == 0 and frozen_run.stdout.strip() == "ran as code", frozen_run.stderr
    source_run = subprocess.run([sys.executable, "-c", code.format(frozen=False)], capture_output=True, text=True,
                                cwd=ROOT, timeout=120)
    assert source_run.returncode != 0 and "ran as code" not in source_run.stdout  # the CLI has no "-c"


def test_version_names_the_app_and_the_engine_build(capsys):
    from app.main import main

    assert main(["--version"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"MTP Studio {build_record.app_version()}"
    assert out[0] != "MTP Studio unknown"
    assert any(line.startswith("engine") for line in out[1:])


def test_the_build_record_of_an_installer_engine_is_described(tmp_path):
    record = {"llama_cpp_python": "0.3.36", "backend": "cpu", "backend_loading": "dynamic",
              "cpu_variants": ["x64", "haswell"], "patch_hash": "abc123", "patches": ["0001-a.patch", "0002-b.patch"]}
    path = tmp_path / build_record.RECORD_NAME
    path.write_text(json.dumps(record))
    lines = build_record.describe(build_record.read_record(path))
    assert lines[0] == ("engine: llama-cpp-python 0.3.36, backend cpu "
                        "(backends and CPU variants chosen at run time)")
    assert "CPU variants: x64, haswell" in lines
    assert "patches (abc123): 0001-a.patch, 0002-b.patch" in lines


def test_a_missing_or_broken_record_says_so(tmp_path):
    assert build_record.read_record(tmp_path / "none.json") == {}
    (tmp_path / "bad.json").write_text("{not json")
    assert build_record.read_record(tmp_path / "bad.json") == {}
    assert "no build record" in build_record.describe({})[0]
