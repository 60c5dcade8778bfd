#!/usr/bin/env python3
"""Smoke-test a packaged MTP Studio the way a user's machine would run it.

    python3 packaging/smoke_frozen.py [ARTIFACT] [--json OUT]

ARTIFACT is what ``packaging/build_linux.sh`` made (the ``.tar.gz``, an
unpacked folder, or the executable); by default the newest tarball in
``dist/``. It is unpacked into a temporary folder and run with a clean set of
environment variables: a fresh HOME, PATH without any venv, no PYTHONPATH, the
working directory outside the source tree, Qt offscreen. Then:

1. ``mtp-studio --version`` prints the app and engine build;
2. ``mtp-studio --smoke-test`` (app/smoke.py) opens the window, loads the
   default model in the frozen worker, streams a reply, kills the worker,
   recovers through the banner, streams again and quits cleanly;
3. while it runs, this script checks from outside that the worker is the
   frozen executable itself (``<exe> -m engine.worker``), not a Python, and
   reads the worker's memory map for the CPU variant ggml chose (never the
   AMX one).

It prints the artifact's size, the cold start (launch to window shown, first
start on a fresh HOME), and the time to the first token, and exits non-zero
on any failure. Standard library only, so any python3 runs it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXE_NAME = "mtp-studio"


def find_artifact(arg: str | None) -> Path:
    if arg:
        return Path(arg).resolve()
    found = sorted((ROOT / "dist").glob("*.tar.gz"), key=lambda p: p.stat().st_mtime)
    if not found:
        sys.exit("error: no artifact given and none in dist/; run packaging/build_linux.sh first")
    return found[-1]


def unpack(artifact: Path, into: Path) -> Path:
    """Return the executable inside ``artifact`` (unpacked into ``into`` if it is an archive)."""
    if artifact.is_file() and artifact.name.endswith(".tar.gz"):
        with tarfile.open(artifact) as tar:
            if hasattr(tarfile, "tar_filter"):  # Python >= 3.11.4 (and backports)
                tar.extractall(into, filter="tar")  # keeps the bundle's own symlinks and modes
            else:
                tar.extractall(into)  # noqa: S202 -- our own artifact
        exes = sorted(into.rglob(EXE_NAME))
        exes = [p for p in exes if p.is_file() and os.access(p, os.X_OK)]
        if not exes:
            sys.exit(f"error: no {EXE_NAME} executable inside {artifact}")
        return exes[0]
    if artifact.is_dir():
        return artifact / EXE_NAME
    return artifact


def clean_env(home: Path) -> dict[str, str]:
    """What a desktop session would hand the app, minus anything from this checkout."""
    runtime = home / "run"
    runtime.mkdir(mode=0o700, parents=True, exist_ok=True)
    return {
        "HOME": str(home), "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8",
        "QT_QPA_PLATFORM": "offscreen", "XDG_RUNTIME_DIR": str(runtime), "TMPDIR": str(home / "tmp"),
    }


def dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def _children(pid: int) -> list[int]:
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == pid:
            out.append(int(proc.name))
    return out


def watch_worker(app_pid: int, exe: Path, seen: dict[str, object], stop: threading.Event) -> None:
    """From outside: which command line the worker runs, and which ggml libraries it mapped."""
    while not stop.is_set():
        for pid in _children(app_pid):
            try:
                cmd = (Path("/proc") / str(pid) / "cmdline").read_bytes().split(b"\0")
                maps = (Path("/proc") / str(pid) / "maps").read_text()
            except OSError:
                continue
            argv = [c.decode() for c in cmd if c]
            if "engine.worker" not in argv:
                continue
            seen["worker_argv"] = argv
            libs = sorted({Path(ln.split()[-1]).name for ln in maps.splitlines() if "libggml-" in ln})
            if libs:
                seen["worker_ggml_libs"] = libs
        stop.wait(0.2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("artifact", nargs="?")
    parser.add_argument("--json", type=Path, help="also write the measurements here")
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args(argv)
    artifact = find_artifact(args.artifact)
    tmp = Path(tempfile.mkdtemp(prefix="mtp-smoke-"))
    ok = False
    try:
        exe = unpack(artifact, tmp / "app")
        home = tmp / "home"
        (home / "tmp").mkdir(parents=True)
        env = clean_env(home)
        result: dict[str, object] = {
            "artifact": str(artifact),
            "artifact_mib": round((artifact.stat().st_size if artifact.is_file() else dir_size(artifact)) / 2**20, 1),
            "unpacked_mib": round(dir_size(exe.parent) / 2**20, 1),
        }
        version = subprocess.run([str(exe), "--version"], env=env, cwd=home, capture_output=True, text=True,
                                 timeout=120)
        print(version.stdout.strip())
        if version.returncode != 0:
            print(version.stderr[-2000:], file=sys.stderr)
            print("FAIL: --version", file=sys.stderr)
            return 1
        result["version"] = version.stdout.strip().splitlines()

        started = time.time()
        proc = subprocess.Popen([str(exe), "--smoke-test"], env=env, cwd=home, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        seen: dict[str, object] = {}
        stop = threading.Event()
        watcher = threading.Thread(target=watch_worker, args=(proc.pid, exe, seen, stop), daemon=True)
        watcher.start()
        stderr_lines: list[str] = []
        threading.Thread(target=lambda: stderr_lines.extend(proc.stderr), daemon=True).start()  # type: ignore[arg-type]
        steps: dict[str, dict] = {}
        timer = threading.Timer(args.timeout, proc.kill)
        timer.start()
        assert proc.stdout is not None
        for line in proc.stdout:
            if not line.startswith('{"smoke"'):
                continue
            event = json.loads(line)
            event["seen_at_s"] = round(time.time() - started, 3)
            steps.setdefault(event["smoke"], event)  # the first of each (first_token comes twice)
            print(f"  {event['smoke']:<16} {json.dumps({k: v for k, v in event.items() if k != 'smoke'})}")
        code = proc.wait()
        timer.cancel()
        stop.set()
        watcher.join(2)
        result["exit_code"] = code
        result["steps"] = steps
        result.update(seen)
        # measured here, from launch to the line arriving: the app's own clock cannot see its exec
        if "window_shown" in steps:
            result["cold_start_s"] = steps["window_shown"]["seen_at_s"]
        if "model_loaded" in steps:
            result["default_model_loaded_s"] = steps["model_loaded"]["seen_at_s"]
        if "first_token" in steps:
            result["first_token_after_send_s"] = steps["first_token"]["since_send_s"]
            result["first_token_since_launch_s"] = steps["first_token"]["seen_at_s"]
        if "recovered" in steps and "worker_killed" in steps:
            result["recovery_s"] = round(steps["recovered"]["seen_at_s"] - steps["worker_killed"]["seen_at_s"], 3)
        problems = []
        if code != 0 or "passed" not in steps:
            problems.append(f"the smoke test exited {code} ({steps.get('failed', {}).get('why', 'no verdict')})")
        argv_seen = seen.get("worker_argv") or []
        if not argv_seen or Path(str(argv_seen[0])).name != EXE_NAME or argv_seen[1:3] != ["-m", "engine.worker"]:
            problems.append(f"the worker was not the frozen executable in worker mode: {argv_seen}")
        libs = [str(x) for x in seen.get("worker_ggml_libs") or []]  # type: ignore[union-attr]
        if any("sapphirerapids" in lib or "amx" in lib for lib in libs):
            problems.append(f"the worker loaded AMX kernels: {libs}")
        print(json.dumps({k: v for k, v in result.items() if k != "steps"}, indent=2))
        if args.json:
            args.json.write_text(json.dumps(result, indent=2) + "\n")
        if problems:
            print("".join(stderr_lines)[-4000:], file=sys.stderr)
            for p in problems:
                print(f"FAIL: {p}", file=sys.stderr)
            return 1
        print(f"PASS: {artifact.name}: {result['artifact_mib']} MiB, cold start {result.get('cold_start_s')} s, "
              f"first token {result.get('first_token_after_send_s')} s after send")
        ok = True
        return 0
    finally:
        if ok or not os.environ.get("MTP_SMOKE_KEEP"):
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"kept {tmp}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
