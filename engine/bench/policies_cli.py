"""``mtp-studio bench-policies PART``: the drafting-policy benchmarks of
engine/bench/policies.py (categories, driver, threads, verify-cost, probes), each
printing ratios measured side by side in one run."""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

from engine.synth.spec import ALL_ARCHITECTURES

PROMPT = " the river model light"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench-policies",
                       help="benchmark drafting policies: categories, driver, threads, verify-cost, probes, "
                            "graph-reuse")
    p.add_argument("part", choices=("categories", "driver", "threads", "verify-cost", "probes", "graph-reuse"))
    p.add_argument("--arch", default="glm4moe", choices=ALL_ARCHITECTURES)
    p.add_argument("--size", default="bench", help="synthetic size: bench, bench-q8_0, bench-q4_0, bench-q4_k_m, tiny")
    p.add_argument("--weights", default="mixed", choices=("oracle", "mixed", "random"))
    p.add_argument("--agree", type=float, default=0.7, help="head agreement of the synthetic model")
    p.add_argument("--agree-run", type=int, default=0,
                   help="agreement per stretch of this many tokens (easy and hard stretches; 0: per token)")
    p.add_argument("--model", help="a GGUF instead of a synthetic model")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--draft-vocab", type=int, default=0, metavar="N",
                   help="the MTP head drafts only among token ids below N (patch 0008; 0: the whole vocabulary)")
    p.add_argument("--gpu-layers", type=int, default=0,
                   help="layers on the GPU (999: all); a software Vulkan device needs MTP_STUDIO_SOFTWARE_GPU=1")
    p.add_argument("--n-max", default="1,2,3,4", help="fixed depths to compare")
    p.add_argument("--adaptive-max", type=int, default=8, help="n_max of adaptive depth")
    p.add_argument("--prompts", type=int, default=9, help="categories of the autotune suite to use")
    p.add_argument("--ngram", action="store_true", help="also n-gram and MTP+n-gram (when the engine has them)")
    p.add_argument("--thread-options", default="", help="threads to sweep (default: 1..cores)")
    p.add_argument("--busy", default="", help="threads part: cores to keep busy, e.g. 1 (quiet run first, always)")
    p.add_argument("--sizes", default="bench,bench-q8_0,bench-q4_0,bench-q4_k_m",
                   help="verify-cost: sizes (weight types)")
    p.set_defaults(func=run)


def _say(text: str) -> None:
    print(text, flush=True)


def _path(args: argparse.Namespace, size: str | None = None) -> Path:
    if args.model:
        return Path(args.model)
    from engine.synth import HeadMap, SynthModel, SynthSpec
    from engine.synth.spec import default_heads

    head = HeadMap("token", args.agree, args.agree_run)
    return SynthModel(SynthSpec(arch=args.arch, size=size or args.size, n_heads=default_heads(args.arch),
                                weights=args.weights, heads=(head,))).path()


def _session(path: Path, threads: int, gpu_layers: int = 0, draft_vocab: int = 0):  # -> Session
    from engine.generation.session import LoadOptions, Session

    return Session(LoadOptions(path=str(path), n_ctx=2048, n_threads=threads, n_gpu_layers=gpu_layers,
                               draft_vocab=draft_vocab))


def run(args: argparse.Namespace) -> int:
    from engine.bench import policies

    depths = [int(x) for x in args.n_max.split(",") if x]
    _say(f"# bench-policies {args.part} — {time.strftime('%Y-%m-%d %H:%M')}, {args.threads} thread(s), "
         f"{args.tokens} tokens, {args.repeats} interleaved repeats; {policies.load_state()}")
    if args.part == "verify-cost":
        return _verify_cost(args)
    path = _path(args)
    _say(f"## {path.parent.name}/{path.name}" + ("" if args.model else
                                                 f" — {args.weights} weights, agreement {args.agree}"
                                                 + (f" in stretches of {args.agree_run}" if args.agree_run else "")))
    if args.part == "threads":
        return _threads(args, path)
    session = _session(path, args.threads, args.gpu_layers, args.draft_vocab)
    try:
        if args.part == "categories":
            from engine.autotune.cli import load_prompts
            from engine.autotune.search import candidates_for

            settings = [s for s in candidates_for(session, args.adaptive_max, p_grid=(), ngram=args.ngram)
                        if s.enabled and (s.adaptive or s.n_max in depths or s.mode != "mtp")]
            policies.categories(session, load_prompts(args.prompts), settings, args.tokens, args.repeats, _say)
        elif args.part == "graph-reuse":
            from engine.bench import graph_reuse
            from engine.speculative.settings import SPECULATION_OFF, mtp

            settings = [("plain", SPECULATION_OFF)]
            if session.mtp_drafter is not None:
                settings += [(f"mtp n_max {n}", mtp(n)) for n in depths]
                settings.append((f"adaptive (max {args.adaptive_max})", mtp(args.adaptive_max, depth="adaptive")))
            graph_reuse.compare(session, PROMPT, args.tokens, settings, _say)
        elif args.part == "probes":
            from engine.autotune.cli import load_prompts

            policies.probes(session, load_prompts(args.prompts), args.adaptive_max, args.tokens, args.repeats, _say)
        else:
            binary = _driver()
            if binary is None:
                _say("(no llama-speculative-simple for this engine: `python packaging/build_reference_driver.py`)")
                return 1
            policies.versus_driver(session, binary, path, PROMPT, args.tokens, depths, args.adaptive_max,
                                   args.repeats, args.threads, _say)
    finally:
        session.close()
    return 0


def _driver() -> Path | None:
    """The C++ driver built for the engine that is loaded (its cache key), if any."""
    from engine.runtime.native import build_info

    key = build_info().get("cache_key")
    from engine import paths

    binary = paths.cache_dir() / "wheels" / str(key) / "bin" / "llama-speculative-simple"
    return binary if binary.exists() else None


def _threads(args: argparse.Namespace, path: Path) -> int:
    from engine.bench import policies
    from engine.speculative.settings import SPECULATION_OFF, mtp

    cores = os.cpu_count() or 1
    options = [int(x) for x in args.thread_options.split(",") if x] or list(range(1, cores + 1))
    busy_cores = [int(x) for x in args.busy.split(",") if x]
    session = _session(path, options[0], args.gpu_layers)
    try:
        specs = [("plain", SPECULATION_OFF, False)]
        if session.mtp_drafter is not None:
            specs.append(("mtp adaptive", mtp(args.adaptive_max, depth="adaptive"), True))
        for label, spec, with_draft in specs:
            draft_options = sorted({1, *options}) if with_draft else None
            for state, cores_busy in (("quiet", []), (f"busy core(s) {busy_cores}", busy_cores)):
                if state != "quiet" and not busy_cores:
                    continue
                procs = policies.busy(cores_busy)
                try:
                    time.sleep(0.5)
                    _say(f"\n### {label}, {state} ({policies.load_state()})")
                    res = policies.thread_sweep(session, PROMPT, args.tokens, options, args.repeats, spec,
                                                draft_options)
                finally:
                    policies.stop(procs)
                base = statistics.median(res[(options[0], draft_options[0] if draft_options else 0)])
                _say(f"{'threads':>7} {'draft threads':>13} {'tok/s':>8} {'vs first':>8}  runs")
                for (t, d), tps in res.items():
                    med = statistics.median(tps)
                    _say(f"{t:7d} {d or t:13d} {med:8.1f} {med / base if base else 0:7.2f}x  "
                         + " ".join(f"{x:.1f}" for x in tps))
    finally:
        session.close()
    return 0


def _verify_cost(args: argparse.Namespace) -> int:
    from engine.bench import policies

    rows = list(range(1, 10))
    _say(f"{'weights':<12} {'1 row ms':>8} " + " ".join(f"{k:>5}" for k in rows[1:]) + "   (k rows / 1 row)")
    for size in [s for s in args.sizes.split(",") if s]:
        path = _path(args, size)
        session = _session(path, args.threads, args.gpu_layers)
        try:
            costs = policies.verify_costs(session, rows, repeats=args.repeats * 10)
        finally:
            session.close()
        one = costs[1]
        _say(f"{size:<12} {1000 * one:8.2f} " + " ".join(f"{costs[k] / one:5.2f}" for k in rows[1:]))
    return 0
