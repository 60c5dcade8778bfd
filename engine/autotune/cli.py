"""``mtp-studio autotune MODEL``: measure, decide, remember; print the table."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from engine import paths

PROMPT_SUITE = Path(__file__).resolve().parents[2] / "assets" / "prompts" / "autotune.json"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("autotune", help="find the fastest speculative settings for this machine and model")
    p.add_argument("model", type=Path)
    p.add_argument("--sidecar", type=Path)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--tokens", type=int, default=96, help="tokens generated per prompt and setting")
    p.add_argument("--prompts", type=int, default=9, help="how many prompts of the suite to use")
    p.add_argument("--max-n", type=int, default=None, help="deepest n_max to try (default: heads, or 8)")
    p.add_argument("--no-save", action="store_true", help="do not store the profile")
    p.add_argument("--jsonl", action="store_true", help="progress and result as JSON lines (for the GUI)")
    p.set_defaults(func=run)


def load_prompts(n: int) -> list[tuple[str, str]]:
    data = json.loads(PROMPT_SUITE.read_text())
    return [(p["category"], p["text"]) for p in data["prompts"]][:n]


def run(args: argparse.Namespace) -> int:
    from engine.autotune import profiles, search
    from engine.generation.session import LoadOptions, Session
    from engine.hardware.probe import probe

    def emit(kind: str, **fields: object) -> None:
        if args.jsonl:
            print(json.dumps({"type": kind, **fields}), flush=True)

    report = probe()
    fingerprint = report.fingerprint()
    engine_key = str(report.engine.get("cache_key") or report.engine.get("llama_cpp_python"))
    emit("hardware", fingerprint=fingerprint, cpu=report.cpu_model, cores=report.cores,
         backend=report.engine.get("backend"))
    session = Session(LoadOptions(path=str(args.model), n_ctx=2048, n_threads=args.threads,
                                  sidecar=str(args.sidecar) if args.sidecar else None))
    try:
        prompts = [[{"role": "user", "content": text}] for _, text in load_prompts(args.prompts)]
        settings = None
        if session.drafter and args.max_n:
            settings = [s for s in search.candidates(session.drafter.n_heads, session.drafter.chained)
                        if s.n_max <= args.max_n]
        emit("model", heads=session.n_heads, mtp=session.mtp_status, rollback=session.rollback_strategy)
        result = search.tune(session, prompts, max_tokens=args.tokens, settings=settings,
                             progress=(lambda p: emit("progress", **p)) if args.jsonl else None)
    finally:
        session.close()
    best = next(m for m in result.measurements if m.setting == result.best)
    if not args.no_save:
        store = profiles.ProfileStore(paths.data_dir() / "autotune-profiles.json")
        store.save(profiles.new_profile(fingerprint, str(args.model), engine_key, result.best.to_json(),
                                        best.mean_ratio, result.reason))
    if args.jsonl:
        emit("result", best=result.best.to_json(), label=result.best.label, reason=result.reason,
             rows=[{"setting": m.setting.label, "tps": m.mean_tps, "ratio": m.mean_ratio,
                    "lower": m.lower_bound, "acceptance": m.acceptance, "prompts": len(m.tps),
                    "identical": m.identical, "identity": m.identity, "dropped": m.dropped_after is not None,
                    "per_pos": m.per_pos} for m in result.measurements])
        return 0
    print(result.table())
    print(f"\ndecision: {result.best.label}. {result.reason}")
    if not args.no_save:
        print(f"saved as the profile for this machine ({fingerprint}), model and engine build.")
    sys.stdout.flush()
    return 0
