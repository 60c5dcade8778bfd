"""The fault and fuzz campaigns of issues 17 and 31 as a repeatable chaos run.

    .venv/bin/python -m tests.chaos [--seed 0] [--quick] [--only gguf,worker,downloads,protocol,campaign]
                                    [--case SUBSTRING] [-v] [--keep DIR] [--json FILE]

Five categories (docs/reliability.md explains each and what "clean" means):

  gguf       seeded mutations of small synthetic models (bit flips, wrong value types, huge counts,
             deep nesting, truncations, hostile chat templates) through `mtp-studio info`,
             `mtp-studio models doctor`, `mtp-studio models list` and a worker load + short reply
  worker     SIGKILL of the worker at random points of a reply streamed by `mtp-studio chat`,
             and of a worker driven by the protocol client; then a new worker must answer
  downloads  the loopback hub stand-in (tests/fake_hub.py) and hostile servers: downloads killed
             at random byte offsets and resumed, 206 from byte 0, wrong Content-Range, truncated
             bodies, stalls, a redirect to another host (the token must not follow), two downloads
             of one file at once; every file that ends complete must have the right sha256
  protocol   malformed lines on the worker's stdin; after each the worker must still answer
  campaign   issue 31's findings: a lone surrogate in each text field then a good request, Host
             look-alikes, a silent connection and a slow header on the HTTP server; RPC servers that
             trickle, announce 2^32-1 devices or stay silent; hub names with a NUL or `..`

It prints one table row per category and step, lists every failing case with
how to rerun it, and exits 1 if any bad column (tracebacks, crashes, hangs,
corrupt files, lost replies, other failures) is not zero. Everything runs with
one engine thread, fixed seeds and temporary folders that are removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

from tests.chaos import common as C

CATEGORIES = ("gguf", "worker", "downloads", "protocol", "campaign")


class Context:
    def __init__(self, args: argparse.Namespace, tmp: Path) -> None:
        self.seed: int = args.seed
        self.quick: bool = args.quick
        self.case_filter: str | None = args.case
        self.keep: Path | None = args.keep
        self.tmp = tmp
        self.tally = C.Tally(verbose=args.verbose)

    def rng(self, *parts: object) -> random.Random:
        return random.Random(":".join(map(str, (self.seed, *parts))))

    def wanted(self, case: str) -> bool:
        return self.case_filter is None or self.case_filter in case

    def keep_file(self, case: str, path: Path) -> None:
        if self.keep is not None and path.exists():
            dest = self.keep / case
            dest.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, dest / path.name)


def base_models() -> dict[str, dict[str, Path]]:
    from engine.synth import SynthModel, SynthSpec
    from engine.synth.spec import default_heads

    out = {}
    for arch in ("glm4moe", "step35"):
        model = SynthModel(SynthSpec(arch=arch, n_heads=default_heads(arch)))
        out[arch] = {layout: model.path(layout) for layout in ("combined", "trunk", "sidecar")}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="about a minute: fewer cases per category")
    parser.add_argument("--only", default=",".join(CATEGORIES), help="comma-separated categories")
    parser.add_argument("--case", help="run only the cases whose id contains this (e.g. gguf-017)")
    parser.add_argument("--keep", type=Path, help="copy the inputs of failing cases here")
    parser.add_argument("-v", "--verbose", action="store_true", help="print every case's outcome on stderr")
    parser.add_argument("--json", type=Path, help="also write the tally and failures as JSON")
    args = parser.parse_args(argv)
    only = [c.strip() for c in args.only.split(",") if c.strip()]
    unknown = set(only) - set(CATEGORIES)
    if unknown:
        parser.error(f"unknown categories {sorted(unknown)}; choose from {CATEGORIES}")

    C.limit_memory(8 << 30)  # nothing here may take the shared machine down
    bases = base_models()  # before the environment points the cache elsewhere
    tmp = Path(tempfile.mkdtemp(prefix="mtp-chaos-"))
    os.environ.pop("HF_TOKEN", None)
    os.environ.update({
        "MTP_STUDIO_DATA_DIR": str(tmp / "data"), "MTP_STUDIO_CONFIG_DIR": str(tmp / "config"),
        "HF_HOME": str(tmp / "hf"), "HF_HUB_DISABLE_TELEMETRY": "1", "PYTHON_KEYRING_BACKEND":
        "keyring.backends.null.Keyring", "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "",
    })
    ctx = Context(args, tmp)
    started = time.monotonic()
    try:
        for category in only:
            t0 = time.monotonic()
            print(f"== {category}", file=sys.stderr, flush=True)
            if category == "gguf":
                from tests.chaos import run_gguf

                run_gguf.run(ctx, bases)
            elif category == "worker":
                from tests.chaos import run_worker

                run_worker.run(ctx, bases)
            elif category == "downloads":
                from tests.chaos import run_downloads

                run_downloads.run(ctx)
            elif category == "protocol":
                from tests.chaos import run_protocol

                run_protocol.run(ctx, bases)
            elif category == "campaign":
                from tests.chaos import run_campaign

                run_campaign.run(ctx, bases)
            ctx.tally.seconds[category] = time.monotonic() - t0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    elapsed = time.monotonic() - started
    tally = ctx.tally
    print()
    print(f"chaos: seed {args.seed}{' --quick' if args.quick else ''}, {elapsed:.0f} s "
          f"({', '.join(f'{k} {v:.0f} s' for k, v in tally.seconds.items())})")
    print()
    print(tally.table())
    for row, notes in tally.notes.items():
        print(f"\n{row}: " + "; ".join(f"{n} × {k}" for k, n in notes.most_common()))
    if tally.failures:
        print(f"\n{len(tally.failures)} failing outcome(s):")
        for f in tally.failures:
            print(f"  [{f.outcome}] {f.case} ({f.row}): {f.detail}")
        print(f"\nrerun one: .venv/bin/python -m tests.chaos --seed {args.seed}{' --quick' if args.quick else ''} "
              "--only CATEGORY --case CASE-ID")
    if args.json:
        args.json.write_text(json.dumps({
            "seed": args.seed, "quick": args.quick, "seconds": elapsed,
            "rows": {r: dict(c) for r, c in tally.rows.items()},
            "notes": {r: dict(c) for r, c in tally.notes.items()},
            "failures": [f.__dict__ for f in tally.failures],
        }, indent=2))
    return 1 if tally.bad_total() else 0


if __name__ == "__main__":
    sys.exit(main())
