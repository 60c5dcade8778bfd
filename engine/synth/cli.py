"""``mtp-studio synth``: generate synthetic MTP models from the command line."""

from __future__ import annotations

import argparse
import json

from engine.synth.spec import ARCHITECTURES, SIZES, HeadMap, SynthSpec
from engine.synth.writer import LAYOUTS, SynthModel


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("synth", help="generate a synthetic MTP model (cached) and print its path")
    p.add_argument("--arch", choices=ARCHITECTURES, default="glm4moe")
    p.add_argument("--size", choices=[s for s in SIZES if "-other-" not in s], default="tiny")
    p.add_argument("--weights", choices=("oracle", "random", "mixed"), default="oracle")
    p.add_argument("--heads", type=int, default=None, help="MTP heads (step35 default 3, others 1)")
    p.add_argument("--reads", choices=("token", "hidden"), default="token",
                   help="oracle heads read the input token or the trunk hidden state")
    p.add_argument("--agree", type=float, default=1.0, help="fraction of tokens the head gets right")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dense", action="store_true", help="dense FFN trunk (glm4moe)")
    p.add_argument("--layout", choices=LAYOUTS, action="append",
                   help="files to write (repeatable; default: combined)")
    p.add_argument("--json", action="store_true", help="print the model description as JSON")
    p.set_defaults(func=run)


def spec_from_args(args: argparse.Namespace) -> SynthSpec:
    heads = args.heads if args.heads is not None else (3 if args.arch == "step35" else 1)
    return SynthSpec(arch=args.arch, size=args.size, weights=args.weights, n_heads=heads,
                     heads=(HeadMap(args.reads, args.agree),), seed=args.seed, dense=args.dense)


def run(args: argparse.Namespace) -> int:
    model = SynthModel(spec_from_args(args))
    for layout in args.layout or ["combined"]:
        print(model.path(layout))
    if args.json:
        desc = model.description()
        desc.pop("oracle", None)
        print(json.dumps(desc, indent=2))
    return 0
