"""``mtp-studio hardware`` and ``mtp-studio engine build``."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from engine.build_record import engine_patches

BUILD_SCRIPT = Path(__file__).resolve().parents[2] / "packaging" / "build_engine.py"


def register(sub: argparse._SubParsersAction) -> None:
    hw = sub.add_parser("hardware", help="what this machine is and which engine build fits it")
    hw.add_argument("--json", action="store_true")
    hw.set_defaults(func=cmd_hardware)
    eng = sub.add_parser("engine", help="engine builds")
    eng_sub = eng.add_subparsers(dest="engine_command", metavar="ACTION", required=True)
    build = eng_sub.add_parser("build", help="build llama-cpp-python for a backend and install it")
    build.add_argument("--backend", choices=("cpu", "cuda", "metal", "vulkan", "rocm"), required=True)
    build.set_defaults(func=cmd_engine_build)


def cmd_hardware(args: argparse.Namespace) -> int:
    from engine.hardware.probe import probe
    from engine.hardware.recommend import recommend

    report = probe()
    rec = recommend(report)
    if args.json:
        data = report.to_json()
        data["fingerprint"] = report.fingerprint()
        data["recommendation"] = {"backend": rec.backend, "active": rec.active, "reasons": rec.reasons,
                                  "command": None if rec.matches else rec.command}
        print(json.dumps(data, indent=2))
        return 0
    ram = f"{report.ram_mib / 1024:.1f} GiB" if report.ram_mib else "unknown"
    print(f"machine      {report.os}, {report.machine}, {report.cores} cores, {ram} RAM")
    print(f"cpu          {report.cpu_model}  [{' '.join(report.cpu_flags)}]")
    for g in report.gpus or []:
        mem = f", {g.memory_mib} MiB" if g.memory_mib else ""
        soft = ", software: asked for with MTP_STUDIO_SOFTWARE_GPU" if g.software else ""
        print(f"gpu          {g.name} ({g.vendor}, {g.api}{mem}" + (f", driver {g.driver}" if g.driver else "")
              + soft + ")")
    if not report.gpus:
        print("gpu          none found")
    eng = report.engine
    print(f"engine       llama-cpp-python {eng.get('llama_cpp_python')}, backend {eng.get('backend')}, "
          f"GPU offload {'yes' if report.gpu_offload else 'no'}")
    print(f"  patches    {engine_patches(eng)}")
    for d in report.engine_devices:
        print(f"  device     {d.name}: {d.description} ({d.type}, {d.free_mib}/{d.total_mib} MiB free)")
    print(f"fingerprint  {report.fingerprint()}")
    print("recommend    " + " ".join(rec.reasons))
    if not rec.matches:
        print(f"             run: {rec.command}")
    for note in report.notes:
        print(f"note         {note}")
    return 0


def cmd_engine_build(args: argparse.Namespace) -> int:
    """Build in a child process; the working engine stays installed if the build fails."""
    from engine import frozen

    if frozen.is_frozen():
        print("error: this installed MTP Studio carries its engine and cannot build another (no compiler, no "
              "build script). GPU backends it ships are picked at start; to build an engine, use a source "
              "checkout (README).", file=sys.stderr)
        return 2
    proc = subprocess.run([sys.executable, str(BUILD_SCRIPT), "--backend", args.backend])
    if proc.returncode != 0:
        print(f"error: the {args.backend} engine build failed (exit {proc.returncode}); the engine "
              "that was installed is still in place.", file=sys.stderr)
    return proc.returncode
