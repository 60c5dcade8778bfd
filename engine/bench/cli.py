"""``mtp-studio bench``: plain vs MTP at several acceptance levels and depths,
and ours vs llama.cpp's C++ driver, each measured side by side in one run."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from engine.bench import measure, reference
from engine.generation.session import LoadOptions, Session
from engine.synth import HeadMap, SynthModel, SynthSpec

PROMPT = " the river model light"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="measure plain vs MTP, and ours vs llama.cpp's driver")
    p.add_argument("--arch", default="glm4moe", choices=("glm4moe", "step35", "qwen35", "qwen3next"))
    p.add_argument("--size", default="bench", help="synthetic model size (bench = memory-bound)")
    p.add_argument("--acceptance", default="1.0,0.5,0.0",
                   help="comma-separated head agreement levels (oracle models)")
    p.add_argument("--n-max", default="1,2,3,4", help="comma-separated draft depths")
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--dense", action="store_true", help="dense FFN trunk (glm4moe; the MTP block stays MoE)")
    p.add_argument("--model", help="benchmark this GGUF instead of synthetic ones")
    p.add_argument("--reference", choices=("auto", "skip", "only"), default="auto",
                   help="compare with llama-speculative-simple (auto: if it is built)")
    p.add_argument("--reference-n-max", type=int, default=3)
    p.add_argument("--autotune", action="store_true",
                   help="instead: check autotune's choice against an exhaustive sweep")
    p.set_defaults(func=run)


def _say(text: str) -> None:
    print(text, flush=True)


def run(args: argparse.Namespace) -> int:
    depths = [int(x) for x in args.n_max.split(",") if x]
    levels = [float(x) for x in args.acceptance.split(",") if x]
    heads = 3 if args.arch == "step35" else 1
    _say(f"# MTP Studio benchmark — {time.strftime('%Y-%m-%d %H:%M')}, {args.threads} thread(s), "
         f"{args.tokens} tokens, {args.repeats} interleaved repeats; medians")
    if args.autotune:
        from engine.bench.autotune_check import check

        check(args.arch, args.size, levels, args.tokens, args.threads, args.dense, say=_say)
        return 0
    if args.reference != "only":
        targets = [(Path(args.model), None)] if args.model else [
            (SynthModel(SynthSpec(arch=args.arch, size=args.size, n_heads=heads, dense=args.dense,
                                  heads=(HeadMap("token", a),))).path(), a) for a in levels
        ]
        for path, agree in targets:
            kind = f"{args.arch}{' dense' if args.dense else ''} {args.size}"
            _say(f"\n## {path.name}" + (f" — {kind}, head agreement {agree}" if agree is not None else ""))
            session = Session(LoadOptions(path=str(path), n_ctx=2048, n_threads=args.threads))
            try:
                rows = measure.compare(session, PROMPT, args.tokens, depths if session.drafter else [],
                                       args.repeats)
            finally:
                session.close()
            _say(measure.format_table(rows))
    if args.reference == "skip":
        return 0
    return _reference(args, heads)


def _reference(args: argparse.Namespace, heads: int) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "packaging"))
    try:
        import build_reference_driver as brd  # type: ignore[import-not-found]
    except ImportError:
        _say("\n(reference comparison skipped: packaging/ is not next to the engine)")
        return 0
    binary = brd.driver_path("cpu")
    if not binary.exists():
        if args.reference == "auto":
            _say(f"\n(reference comparison skipped: build it with `python packaging/build_reference_driver.py`;"
                 f" expected at {binary})")
            return 0
        binary = brd.build("cpu")
    path = Path(args.model) if args.model else SynthModel(
        SynthSpec(arch=args.arch, size=args.size, n_heads=heads, dense=args.dense,
                  heads=(HeadMap("token", 1.0),))).path()
    n_max = args.reference_n_max
    _say(f"\n## ours vs llama.cpp's llama-speculative-simple — {path.name}, n_max {n_max}")
    session = Session(LoadOptions(path=str(path), n_ctx=2048, n_threads=args.threads))
    try:
        comp = reference.compare(session, binary, path, PROMPT, args.tokens, n_max, args.repeats, args.threads)
    finally:
        session.close()
    same, n = comp.rounds_equal()
    ours_d = sum(d for _, d in comp.ours_rounds)
    ours_a = sum(a for a, _ in comp.ours_rounds)
    theirs_d = sum(d for _, d in comp.theirs_rounds)
    theirs_a = sum(a for a, _ in comp.theirs_rounds)
    _say(f"{'loop':<10} {'tok/s (median)':>15} {'drafted':>8} {'accepted':>9} {'rounds':>7}")
    _say(f"{'ours':<10} {sorted(comp.ours)[len(comp.ours) // 2]:15.1f} {ours_d:8d} {ours_a:9d} "
         f"{len(comp.ours_rounds):7d}")
    _say(f"{'llama.cpp':<10} {sorted(comp.theirs)[len(comp.theirs) // 2]:15.1f} {theirs_d:8d} {theirs_a:9d} "
         f"{len(comp.theirs_rounds):7d}")
    _say(f"ours / llama.cpp = {comp.ratio:.3f}x (median of per-repeat ratios); per-round counts "
         f"{'equal' if same else 'DIFFER'} over the first {n} rounds")
    return 0
