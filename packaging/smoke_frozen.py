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

With ``--vulkan`` (an artifact built by ``build_linux.sh --gpu vulkan``, on a
machine with the Vulkan loader and a driver; without a GPU, Mesa's lavapipe
from ``mesa-vulkan-drivers``) it also checks the GPU backend:

4. the worker of step 2 mapped ``libggml-vulkan.so`` beside its CPU variant, and
   ``mtp-studio hardware --json`` lists Vulkan among the loaded backends but no
   software device (lavapipe is never counted as a GPU by default);
5. with ``MTP_STUDIO_SOFTWARE_GPU=1`` the hardware report lists the software
   Vulkan device, and ``mtp-studio chat --gpu-layers 999`` generates on it:
   the worker's log says every layer was offloaded to it, and the greedy reply
   equals the CPU's (``--gpu-layers 0``) word for word;
6. with the system's ``libvulkan.so.1`` made unloadable (a private mount
   namespace; root or sudo) the app skips Vulkan, runs on a CPU variant and
   gives the same reply -- a machine without the Vulkan loader.

Mesa 22.3's lavapipe crashes now and then (SIGSEGV in its queue thread): a
step whose process dies of a signal is run once more, and the output says so.
A wrong output is never retried.
"""

from __future__ import annotations

import argparse
import json
import os
import re
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


VULKAN_PROMPT = "The capital of France is"
VULKAN_TOKENS = 8
SOFTWARE_RENDERERS = ("llvmpipe", "lavapipe", "swiftshader", "softpipe")  # as engine/hardware/parsers.py
_OFFLOADED = re.compile(r"offloaded (\d+)/(\d+) layers to GPU")


def run_once_more_after_a_crash(cmd: list[str], env: dict[str, str], cwd: Path, timeout: float,
                                notes: list[str]) -> subprocess.CompletedProcess[str]:
    """Run ``cmd``; if it dies of a signal (lavapipe's crashes), run it once more and note it."""
    proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode < 0:
        notes.append(f"{' '.join(cmd[1:3])}: died of signal {-proc.returncode}, ran it once more")
        print(f"  (retry) {notes[-1]}")
        proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    return proc


def _hardware(exe: Path, env: dict[str, str], cwd: Path, notes: list[str]) -> dict:
    proc = run_once_more_after_a_crash([str(exe), "hardware", "--json"], env, cwd, 300, notes)
    if proc.returncode != 0:
        raise RuntimeError(f"hardware --json exited {proc.returncode}: {proc.stderr[-1500:]}")
    return json.loads(proc.stdout)


def _chat(exe: Path, env: dict[str, str], cwd: Path, gpu_layers: int, notes: list[str]) -> tuple[str, str]:
    cmd = [str(exe), "chat", VULKAN_PROMPT, "--max-tokens", str(VULKAN_TOKENS), "--gpu-layers", str(gpu_layers),
           "--verbose"]
    started = time.time()
    proc = run_once_more_after_a_crash(cmd, env, cwd, 600, notes)
    if proc.returncode != 0:
        raise RuntimeError(f"chat --gpu-layers {gpu_layers} exited {proc.returncode}: {proc.stderr[-1500:]}")
    print(f"  chat --gpu-layers {gpu_layers:<4} {time.time() - started:5.1f} s  {proc.stdout.strip()!r}")
    return proc.stdout.strip(), proc.stderr


def _hide_loader_prefix() -> list[str] | None:
    """A command prefix that runs its command with the system's libvulkan.so.1 unloadable, or None.

    A private mount namespace with /dev/null bound over the loader's file: the
    dynamic linker then cannot load it, as on a machine without libvulkan1 (for
    ggml both are a failed dlopen of libggml-vulkan.so). Needs root or sudo.
    """
    places = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib")
    found = [Path(d) / "libvulkan.so.1" for d in places if (Path(d) / "libvulkan.so.1").exists()]
    if not found or not shutil.which("unshare"):
        return None
    real = str(found[0].resolve())
    hide = ["unshare", "-m", "sh", "-c", f'mount --bind /dev/null "{real}" && exec "$@"', "sh"]
    if os.geteuid() == 0:
        return hide
    if shutil.which("sudo") and subprocess.run(["sudo", "-n", "true"], capture_output=True).returncode == 0:
        return ["sudo", "-n", "--preserve-env", *hide]
    return None


def without_vulkan_loader(exe: Path, env: dict[str, str], cwd: Path, cpu_text: str,
                          notes: list[str]) -> tuple[dict | str, list[str]]:
    """The same app on a machine without the Vulkan loader: Vulkan is skipped, the CPU runs, the reply is the same."""
    prefix = _hide_loader_prefix()
    if prefix is None:
        return "not run: needs root or sudo for a private mount namespace (unshare -m), and libvulkan.so.1", []
    problems = []
    proc = run_once_more_after_a_crash([*prefix, str(exe), "hardware", "--json"], env, cwd, 300, notes)
    if proc.returncode != 0:
        return {}, [f"without the Vulkan loader: hardware --json exited {proc.returncode}: {proc.stderr[-1500:]}"]
    loaded = [f"{b.get('name')} ({b.get('library')})"
              for b in json.loads(proc.stdout).get("engine", {}).get("loaded_backends") or []]
    if any(b.startswith("Vulkan") for b in loaded) or not any(b.startswith("CPU") for b in loaded):
        problems.append(f"without the Vulkan loader the loaded backends are {loaded}")
    cmd = [*prefix, str(exe), "chat", VULKAN_PROMPT, "--max-tokens", str(VULKAN_TOKENS), "--gpu-layers", "999"]
    chat = run_once_more_after_a_crash(cmd, env, cwd, 300, notes)
    text = chat.stdout.strip()
    print(f"  no libvulkan.so.1  {loaded}  chat --gpu-layers 999: {text!r}")
    if chat.returncode != 0 or text != cpu_text:
        problems.append(f"without the Vulkan loader: chat exited {chat.returncode} with {text!r} "
                        f"(CPU: {cpu_text!r}) {chat.stderr[-800:]}")
    return {"loaded_backends": loaded, "reply": text}, problems


def vulkan_checks(exe: Path, env: dict[str, str], cwd: Path, worker_libs: list[str]) -> tuple[dict, list[str]]:
    """Steps 4 and 5 of the module docstring: the Vulkan backend loads, and generates on the software device."""
    out: dict[str, object] = {}
    problems: list[str] = []
    notes: list[str] = []
    if "libggml-vulkan.so" not in worker_libs:
        problems.append(f"the app's worker did not load the Vulkan backend: {worker_libs}")
    try:
        report = _hardware(exe, env, cwd, notes)
        loaded = report.get("engine", {}).get("loaded_backends") or []
        devices = report.get("engine_devices") or []
        out["loaded_backends"] = [f"{b.get('name')} ({b.get('library')})" for b in loaded]
        out["devices_by_default"] = [f"{d['name']}: {d['description']} ({d['type']})" for d in devices]
        if not any(b.get("name") == "Vulkan" and b.get("library") == "libggml-vulkan.so" for b in loaded):
            problems.append(f"hardware --json: Vulkan is not among the loaded backends: {out['loaded_backends']}")
        if any(s in d["description"].lower() for d in devices for s in SOFTWARE_RENDERERS):
            problems.append(f"a software Vulkan device is listed without MTP_STUDIO_SOFTWARE_GPU: "
                            f"{out['devices_by_default']}")

        soft_env = dict(env, MTP_STUDIO_SOFTWARE_GPU="1", MTP_STUDIO_WORKER_VERBOSE="1")
        report = _hardware(exe, soft_env, cwd, notes)
        devices = report.get("engine_devices") or []
        soft = [d for d in devices if d["name"].startswith("Vulkan")]
        out["devices_software_gpu"] = [f"{d['name']}: {d['description']} ({d['type']}, {d['total_mib']} MiB)"
                                       for d in devices]
        if not soft:
            problems.append(f"MTP_STUDIO_SOFTWARE_GPU=1: no Vulkan device listed: {out['devices_software_gpu']}")

        cpu_text, _ = _chat(exe, env, cwd, 0, notes)
        gpu_text, log = _chat(exe, soft_env, cwd, 999, notes)
        out["reply_cpu"], out["reply_vulkan"] = cpu_text, gpu_text
        found = [ln for ln in log.splitlines() if "ggml_vulkan: 0 = " in ln or "using device Vulkan" in ln]
        out["worker_vulkan_device"] = found[0].split("] ", 1)[-1] if found else None
        m = _OFFLOADED.search(log)
        out["offloaded_layers"] = f"{m.group(1)}/{m.group(2)}" if m else None
        if not found:
            problems.append("the worker's log names no Vulkan device (ggml_vulkan: 0 = ..., using device Vulkan0)")
        if not m or m.group(1) != m.group(2) or int(m.group(1)) == 0:
            problems.append(f"the worker did not offload every layer: {out['offloaded_layers']}")
        if not gpu_text or gpu_text != cpu_text:
            problems.append(f"greedy reply on Vulkan {gpu_text!r} differs from the CPU's {cpu_text!r}")
        out["without_vulkan_loader"], hidden_problems = without_vulkan_loader(exe, soft_env, cwd, cpu_text, notes)
        problems += hidden_problems
    except (RuntimeError, ValueError, KeyError, subprocess.TimeoutExpired) as exc:
        problems.append(f"vulkan check: {exc}")
    out["retried_after_a_crash"] = notes
    return out, problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("artifact", nargs="?")
    parser.add_argument("--json", type=Path, help="also write the measurements here")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--vulkan", action="store_true",
                        help="also check the Vulkan backend (a build_linux.sh --gpu vulkan artifact; lavapipe will do)")
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
        if args.vulkan:
            print("vulkan:")
            result["vulkan"], vk_problems = vulkan_checks(exe, env, home, libs)
            problems += vk_problems
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
