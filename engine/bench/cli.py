"""``mtp-studio bench``: plain vs MTP at several acceptance levels and depths,
and ours vs llama.cpp's C++ driver, each measured side by side in one run."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from engine.bench import measure, reference
from engine.generation.session import LoadOptions, Session
from engine.synth import HeadMap, SynthModel, SynthSpec
from engine.synth.spec import ALL_ARCHITECTURES, default_heads

PROMPT = " the river model light"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="measure plain vs MTP, and ours vs llama.cpp's driver")
    p.add_argument("--arch", default="glm4moe", choices=ALL_ARCHITECTURES)
    p.add_argument("--size", default="bench", help="synthetic model size (bench = memory-bound)")
    p.add_argument("--weights", default="oracle", choices=("oracle", "mixed", "random"),
                   help="oracle: exact acceptance; mixed/random: the context and the hidden state matter "
                        "(random heads are almost never accepted)")
    p.add_argument("--reads", default="token", choices=("token", "hidden"),
                   help="what the oracle/mixed MTP head reads: the input token, or the trunk's hidden state "
                        "(only a hidden-state head can be misled by a wrong hidden state)")
    p.add_argument("--acceptance", default="1.0,0.5,0.0",
                   help="comma-separated head agreement levels (oracle and mixed models)")
    p.add_argument("--n-max", default="1,2,3,4", help="comma-separated draft depths")
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--draft-vocab", type=int, default=0, metavar="N",
                   help="the MTP head drafts only among token ids below N (patch 0008; 0: the whole vocabulary)")
    p.add_argument("--gpu-layers", type=int, default=0,
                   help="layers on the GPU (999: all); a software Vulkan device needs MTP_STUDIO_SOFTWARE_GPU=1")
    p.add_argument("--dense", action="store_true", help="dense FFN trunk (glm4moe; the MTP block stays MoE)")
    p.add_argument("--model", help="benchmark this GGUF instead of synthetic ones")
    p.add_argument("--reference", choices=("auto", "skip", "only"), default="auto",
                   help="compare with llama-speculative-simple (auto: if it is built)")
    p.add_argument("--reference-n-max", default="3", help="comma-separated draft depths for the comparison")
    p.add_argument("--reference-agree", type=float, default=None,
                   help="head agreement of the compared model (default: the first --acceptance level)")
    p.add_argument("--fold", choices=("on", "off", "compare"), default="on",
                   help="fold the MTP catch-up into the next draft (where the graph allows it); compare: "
                        "folded vs unfolded side by side instead of plain vs MTP")
    p.add_argument("--autotune", action="store_true",
                   help="instead: check autotune's choice against an exhaustive sweep")
    p.add_argument("--drafters", action="store_true",
                   help="instead: plain vs MTP vs n-gram vs MTP+n-gram on an echo-heavy and a generative prompt, "
                        "on the built-in model (no MTP head) and the synthetic one (engine/bench/drafters.py)")
    p.set_defaults(func=run)


def _say(text: str) -> None:
    print(text, flush=True)


def _levels(args: argparse.Namespace) -> list[float | None]:
    """Agreement levels to build models for; random weights have none (one model)."""
    if args.weights == "random":
        return [None]
    return [float(x) for x in args.acceptance.split(",") if x]


def _model(args: argparse.Namespace, heads: int, agree: float | None) -> Path:
    head = HeadMap(args.reads, agree) if agree is not None else HeadMap(args.reads)
    return SynthModel(SynthSpec(arch=args.arch, size=args.size, n_heads=heads, dense=args.dense,
                                weights=args.weights, heads=(head,))).path()


def _kind(args: argparse.Namespace, agree: float | None) -> str:
    kind = f"{args.arch}{' dense' if args.dense else ''} {args.size}, {args.weights} weights"
    if args.weights != "random":
        kind += f", head reads the {args.reads}, agreement {agree}"
    return kind


def run(args: argparse.Namespace) -> int:
    depths = [int(x) for x in args.n_max.split(",") if x]
    levels = [x if x is not None else 1.0 for x in _levels(args)]
    heads = default_heads(args.arch)
    _say(f"# MTP Studio benchmark — {time.strftime('%Y-%m-%d %H:%M')}, {args.threads} thread(s), "
         f"{args.tokens} tokens, {args.repeats} interleaved repeats; medians")
    if args.autotune:
        from engine.bench.autotune_check import check

        check(args.arch, args.size, levels, args.tokens, args.threads, args.dense, say=_say)
        return 0
    if args.drafters:
        return _drafters(args, heads)
    if args.reference != "only":
        targets = [(Path(args.model), "")] if args.model else [
            (_model(args, heads, a), _kind(args, a)) for a in _levels(args)
        ]
        for path, kind in targets:
            _say(f"\n## {path.parent.name}/{path.name}" + (f" — {kind}" if kind else ""))
            if args.fold == "compare":
                from engine.bench import fold

                folds, fold_rows = fold.compare(str(path), PROMPT, args.tokens, depths, args.repeats, args.threads)
                _say(f"folding {'on' if folds else 'OFF (this MTP graph does not crop rows; expect ~1.00x)'}")
                _say(fold.format_table(fold_rows))
                continue
            session = Session(LoadOptions(path=str(path), n_ctx=2048, n_threads=args.threads,
                                          n_gpu_layers=args.gpu_layers, fold=args.fold == "on",
                                          draft_vocab=args.draft_vocab))
            try:
                rows = measure.compare(session, PROMPT, args.tokens, depths if session.mtp_drafter else [],
                                       args.repeats)
            finally:
                session.close()
            _say(measure.format_table(rows))
    if args.reference == "skip":
        return 0
    return _reference(args, heads)


def _drafters(args: argparse.Namespace, heads: int) -> int:
    from engine import default_model
    from engine.bench import drafters

    targets = [(Path(args.model), "", drafters.TEXT_PROMPT)] if args.model else [
        (default_model.default_model_path(), "the built-in model, no MTP head", drafters.TEXT_PROMPT),
        *[(_model(args, heads, a), _kind(args, a), PROMPT) for a in _levels(args)],
    ]
    for path, kind, prompt in targets:
        synthetic = prompt == PROMPT  # byte-token prompts: no echo prompt (engine/bench/drafters.py)
        _say(f"\n## {path.parent.name}/{path.name}" + (f" — {kind}" if kind else ""))
        session = Session(LoadOptions(path=str(path), n_ctx=2048, n_threads=args.threads,
                                      n_gpu_layers=args.gpu_layers))
        try:
            drafters.compare(session, prompt, args.tokens, args.repeats, drafters.MTP_N_MAX, drafters.NGRAM_N_MAX,
                             _say, echo=not synthetic)
        finally:
            session.close()
    return 0


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
    agree = args.reference_agree if args.reference_agree is not None else _levels(args)[0]
    path = Path(args.model) if args.model else _model(args, heads, agree)
    kind = "" if args.model else f" — {_kind(args, agree)}"
    _say(f"\n## ours vs llama.cpp's llama-speculative-simple — {path.parent.name}/{path.name}{kind}")
    _say(f"{'n_max':>5} {'ours tok/s':>10} {'llama.cpp':>10} {'ours/llama.cpp':>14} {'ours d/a':>9} "
         f"{'theirs d/a':>10} {'rounds':>7}  per round: position, drafts, accepted, next token")
    session = Session(LoadOptions(path=str(path), n_ctx=2048, n_threads=args.threads,
                                  n_gpu_layers=args.gpu_layers, draft_vocab=args.draft_vocab))
    try:
        for n_max in (int(x) for x in args.reference_n_max.split(",") if x):
            comp = reference.compare(session, binary, path, PROMPT, args.tokens, n_max, args.repeats, args.threads)
            _say(_reference_row(n_max, comp))
    finally:
        session.close()
    return 0


def _reference_row(n_max: int, comp: reference.Comparison) -> str:
    ours, theirs = comp.ours_run, comp.theirs_run
    assert ours is not None and theirs is not None
    diffs = comp.differences()
    if theirs.replays:
        verdict = (f"not comparable one for one: the driver replayed {theirs.replays} times "
                   f"({reference.common_positions(ours.rounds, theirs)} common positions, {len(diffs)} differ)")
    else:
        verdict = "equal" if not diffs else f"DIFFER: {diffs[0]}"

    def counts(rounds: list[reference.Round]) -> str:
        return f"{sum(r.drafted for r in rounds)}/{sum(r.accepted for r in rounds)}"

    return (f"{n_max:5d} {statistics.median(comp.ours):10.1f} {statistics.median(comp.theirs):10.1f} "
            f"{comp.ratio:13.3f}x {counts(ours.rounds):>9} {counts(theirs.rounds):>10} "
            f"{len(ours.rounds):3d}/{len(theirs.rounds):<3d}  {verdict}")
