"""The installer recipes: the engine-libs build's choices, its incremental patching, and
that every script and workflow at least parses (they run on other OSes; docs/installers.md)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PACKAGING = ROOT / "packaging"


def _load(name: str):
    sys.path.insert(0, str(PACKAGING))
    try:
        spec = importlib.util.spec_from_file_location(name, PACKAGING / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(PACKAGING))


libs = _load("build_engine_libs")


@pytest.mark.skipif(not libs.is_x86(), reason="the CPU variants are x86-64's")
def test_the_installer_engine_picks_cpu_kernels_at_run_time_and_never_builds_amx():
    args = libs.cmake_args(None)
    wanted = {"-DGGML_BACKEND_DL=ON", "-DGGML_CPU_ALL_VARIANTS=ON", "-DBUILD_SHARED_LIBS=ON", "-DGGML_NATIVE=OFF"}
    assert wanted <= set(args)
    assert "-DGGML_NATIVE=ON" not in args
    targets = libs.targets(None)
    assert [t for t in targets if t.startswith("ggml-cpu-")] == [f"ggml-cpu-{v}" for v in libs.X86_VARIANTS]
    assert not any("sapphirerapids" in t or "amx" in t for t in targets)
    assert "ggml-cpu-x64" in targets and "ggml-cpu-haswell" in targets  # the baseline and AVX2


def test_a_gpu_backend_is_its_own_library_and_its_own_cache_entry():
    assert "ggml-cuda" in libs.targets("cuda") and "-DGGML_CUDA=ON" in libs.cmake_args("cuda")
    assert libs.cache_key("cuda") != libs.cache_key(None)
    assert libs.cache_key(None).startswith("llama-cpp-dl-")  # never mistaken for a developer wheel


def test_only_the_libraries_of_our_targets_are_collected(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    names = ["libllama.so", "libllama.so.0", "libggml.so", "libggml-base.so.0", "libggml-cpu-haswell.so",
             "libggml-cpu-sapphirerapids.so", "libggml-cpu-cannonlake.so", "libmtmd.so", "llama-cli"]
    for name in names:
        (bin_dir / name).write_bytes(b"")
    got = {p.name for p in libs._shared_libs(tmp_path, None)}
    if libs.is_x86():
        assert "libggml-cpu-haswell.so" in got
    assert {"libllama.so", "libllama.so.0", "libggml.so", "libggml-base.so.0"} <= got
    assert not got & {"libggml-cpu-sapphirerapids.so", "libggml-cpu-cannonlake.so", "libmtmd.so", "llama-cli"}


def test_the_excluded_variants_are_taken_out_of_the_builds_cmake_copy_and_only_they(tmp_path):
    cmake = tmp_path / "vendor" / "llama.cpp" / "ggml" / "src" / "CMakeLists.txt"
    cmake.parent.mkdir(parents=True)
    sdist = libs.build_engine.cached_sdist()  # the real file where the pinned sdist is cached
    member = "llama_cpp_python-0.3.36/vendor/llama.cpp/ggml/src/CMakeLists.txt"
    text = tarfile.open(sdist).extractfile(member).read().decode() if sdist.is_file() else (
        "        ggml_add_cpu_backend_variant(x64)\n"
        "        ggml_add_cpu_backend_variant(haswell            SSE42 AVX F16C FMA AVX2 BMI2)\n"
        "            ggml_add_cpu_backend_variant(sapphirerapids SSE42 AVX AMX_TILE AMX_INT8)\n")
    cmake.write_text(text)
    libs.restrict_cpu_variants(tmp_path)
    once = cmake.read_text()
    libs.restrict_cpu_variants(tmp_path)
    assert cmake.read_text() == once  # idempotent: a kept tree is edited once
    active = [m.group(2) for m in map(libs._VARIANT_LINE.match, once.splitlines()) if m]
    assert "sapphirerapids" not in active and "x64" in active and "haswell" in active
    assert not set(libs.EXCLUDED_VARIANTS) & set(active)
    assert "# excluded by packaging/build_engine_libs.py: ggml_add_cpu_backend_variant(sapphirerapids" in once


def _patch(path: Path, old: str, new: str) -> None:
    path.write_text(f"--- a/file.txt\n+++ b/file.txt\n@@ -1 +1 @@\n-{old}\n+{new}\n")


def test_patches_added_to_the_series_are_applied_to_the_kept_tree_not_a_fresh_one(tmp_path, monkeypatch):
    src = tmp_path / "llama_cpp_python-0.3.36" / "vendor" / "llama.cpp"
    src.mkdir(parents=True)
    (src / "file.txt").write_text("one\n")
    sdist = tmp_path / "sdist.tar.gz"
    with tarfile.open(sdist, "w:gz") as tar:
        tar.add(tmp_path / "llama_cpp_python-0.3.36", arcname="llama_cpp_python-0.3.36")
    patches = tmp_path / "patches"
    patches.mkdir()
    _patch(patches / "0001-a.patch", "one", "two")
    monkeypatch.setattr(libs.build_engine, "PATCH_DIR", patches)
    work = tmp_path / "work"
    work.mkdir()

    tree = libs._source_tree(work, sdist)
    target = tree / "vendor" / "llama.cpp" / "file.txt"
    assert target.read_text() == "two\n"
    (tree / "kept-build-marker").write_text("the CMake build folder's neighbour")

    _patch(patches / "0002-b.patch", "two", "three")
    tree = libs._source_tree(work, sdist)
    assert target.read_text() == "three\n"
    assert (tree / "kept-build-marker").exists()  # only the new patch was applied

    _patch(patches / "0001-a.patch", "one", "uno")  # an edited patch: start again from the sdist
    with pytest.raises(SystemExit):  # 0002 no longer applies on top of it: stop before compiling
        libs._source_tree(work, sdist)
    (patches / "0002-b.patch").unlink()
    tree = libs._source_tree(work, sdist)
    assert target.read_text() == "uno\n" and not (tree / "kept-build-marker").exists()


@pytest.mark.parametrize("script", ["build_linux.sh", "macos/build_app.sh", "linux/install.sh"])
def test_shell_scripts_parse(script):
    proc = subprocess.run(["bash", "-n", str(PACKAGING / script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_build_linux_takes_vulkan_and_refuses_a_gpu_backend_it_cannot_ship(tmp_path):
    script = str(PACKAGING / "build_linux.sh")
    cuda = subprocess.run(["bash", script, "--gpu", "cuda"], capture_output=True, text=True, timeout=30)
    assert cuda.returncode == 2 and "CUDA's runtime is not shipped" in cuda.stderr
    by_env = subprocess.run(["bash", script], capture_output=True, text=True, timeout=30,
                            env={"PATH": "/usr/bin:/bin", "MTP_GPU": "rocm"})
    assert by_env.returncode == 2 and "--gpu rocm" in by_env.stderr
    # vulkan is accepted: the script gets past its arguments to the interpreter check (none at this path)
    vulkan = subprocess.run(["bash", script, "--gpu", "vulkan"], capture_output=True, text=True, timeout=30,
                            env={"PATH": "/usr/bin:/bin", "PYTHON": str(tmp_path / "no-python")})
    assert vulkan.returncode == 1 and "not found; run packaging/bootstrap.sh" in vulkan.stderr


def test_the_smoke_test_runs_a_crashed_process_once_more_and_says_so(tmp_path):
    smoke = _load("smoke_frozen")
    marker = tmp_path / "crashed-once"
    code = (f"import os, pathlib, signal; m = pathlib.Path({str(marker)!r})\n"
            "if not m.exists(): m.touch(); os.kill(os.getpid(), signal.SIGSEGV)\nprint('second run')")
    notes: list[str] = []
    proc = smoke.run_once_more_after_a_crash([sys.executable, "-c", code], {"PATH": "/usr/bin:/bin"}, tmp_path, 60,
                                             notes)
    assert proc.returncode == 0 and proc.stdout.strip() == "second run"
    assert len(notes) == 1 and notes[0].endswith(": died of signal 11, ran it once more")
    # a process that fails without a signal is a failure, not a crash: run once
    notes.clear()
    failed = smoke.run_once_more_after_a_crash([sys.executable, "-c", "raise SystemExit(3)"], {}, tmp_path, 60, notes)
    assert failed.returncode == 3 and notes == []


def test_the_release_workflow_builds_on_three_oses_and_its_bash_steps_parse():
    flow = yaml.safe_load((ROOT / ".github" / "workflows" / "release.yml").read_text())
    build = flow["jobs"]["build"]
    oses = [m["os"].split("-")[0] for m in build["strategy"]["matrix"]["include"]]
    assert sorted(oses) == ["macos", "ubuntu", "windows"]
    bash_steps = [s["run"] for s in build["steps"] if "run" in s and s.get("shell") == "bash"]
    assert bash_steps
    for run in bash_steps:
        proc = subprocess.run(["bash", "-n"], input=run, capture_output=True, text=True)
        assert proc.returncode == 0, (run, proc.stderr)
    # the Linux tarball carries the Vulkan backend, and its smoke test checks it
    assert any("build_linux.sh --gpu vulkan" in run for run in bash_steps)
    assert any("smoke_frozen.py --vulkan" in run for run in bash_steps)


def test_the_pyinstaller_spec_and_the_inno_script_are_well_formed():
    compile((PACKAGING / "mtp_studio.spec").read_text(), "mtp_studio.spec", "exec")
    iss = (PACKAGING / "windows" / "mtp-studio.iss").read_text().splitlines()
    directives = [ln.split()[0] for ln in iss if ln.startswith("#")]
    opened = sum(d in ("#ifdef", "#ifndef", "#if") for d in directives)
    assert opened == directives.count("#endif")
    sections = [ln for ln in iss if ln.startswith("[")]
    assert sections == ["[Setup]", "[Languages]", "[Tasks]", "[Files]", "[Icons]", "[Run]"]


def test_the_desktop_entry_starts_the_gui_not_the_cli():
    entry = dict(ln.split("=", 1) for ln in (PACKAGING / "linux" / "mtp-studio.desktop").read_text().splitlines()
                 if "=" in ln)
    assert entry["Exec"] == "mtp-studio"  # a file argument would go to the CLI (app/main.py)
    assert entry["Icon"] == "mtp-studio" and entry["Type"] == "Application"
