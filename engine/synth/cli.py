"""``mtp-studio synth``: generate synthetic MTP models from the command line."""

from __future__ import annotations

import argparse
import json
import sys

from engine.synth.spec import ALL_ARCHITECTURES, DERIVED_ARCHITECTURES, SIZES, HeadMap, SynthSpec, default_heads
from engine.synth.writer import LAYOUTS, SynthModel


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("synth", help="generate a synthetic MTP model (cached) and print its path")
    p.add_argument("--arch", choices=ALL_ARCHITECTURES, default="glm4moe")
    p.add_argument("--size", choices=[s for s in SIZES if "-other-" not in s], default="tiny")
    p.add_argument("--weights", choices=("oracle", "random", "mixed"), default=None,
                   help=f"default: oracle; random for {', '.join(DERIVED_ARCHITECTURES)} (no oracle layout)")
    p.add_argument("--heads", type=int, default=None,
                   help="MTP heads (default: step35 3, mimo2 and hy_v3 2, others 1)")
    p.add_argument("--reads", choices=("token", "hidden"), default="token",
                   help="oracle heads read the input token or the trunk hidden state")
    p.add_argument("--agree", type=float, default=1.0, help="fraction of tokens the head gets right")
    p.add_argument("--agree-run", type=int, default=0,
                   help="decide agreement per stretch of this many tokens of the target's text (0: per token)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dense", action="store_true", help="dense FFN trunk (glm4moe)")
    p.add_argument("--layout", choices=LAYOUTS, action="append",
                   help="files to write (repeatable; default: combined)")
    p.add_argument("--projector", action="store_true",
                   help="also write a vision projector (mmproj-*.gguf) for the target (qwen35, qwen35moe)")
    p.add_argument("--json", action="store_true", help="print the model description as JSON")
    p.set_defaults(func=run)


def spec_from_args(args: argparse.Namespace) -> SynthSpec:
    heads = args.heads if args.heads is not None else default_heads(args.arch)
    weights = args.weights or ("random" if args.arch in DERIVED_ARCHITECTURES else "oracle")
    return SynthSpec(arch=args.arch, size=args.size, weights=weights, n_heads=heads,
                     heads=(HeadMap(args.reads, args.agree, args.agree_run),), seed=args.seed, dense=args.dense)


def run(args: argparse.Namespace) -> int:
    try:
        spec = spec_from_args(args)
    except ValueError as exc:  # e.g. oracle weights for a derived architecture
        print(f"error: {exc}", file=sys.stderr)
        return 2
    model = SynthModel(spec)
    for layout in args.layout or ["combined"]:
        print(model.path(layout))
    if args.projector:
        from engine.synth.projector import ProjectorSpec, projector_path

        try:
            print(projector_path(ProjectorSpec(target=spec)))
        except ValueError as exc:  # an architecture no released projector feeds
            print(f"error: {exc}", file=sys.stderr)
            return 2
    if args.json:
        desc = model.description()
        desc.pop("oracle", None)
        print(json.dumps(desc, indent=2))
    return 0
