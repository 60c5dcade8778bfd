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
    p.add_argument("--n-max", type=int, default=None, help="deepest n_max to try (default: what the model drafts)")
    p.add_argument("--max-n", type=int, dest="n_max", help=argparse.SUPPRESS)  # the flag's old name
    p.add_argument("--no-save", action="store_true", help="do not store the profile")
    p.add_argument("--jsonl", action="store_true", help="progress and result as JSON lines (for the GUI)")
    p.set_defaults(func=run)


def load_prompts(n: int) -> list[tuple[str, str]]:
    data = json.loads(PROMPT_SUITE.read_text())
    return [(p["category"], p["text"]) for p in data["prompts"]][:n]


def run(args: argparse.Namespace) -> int:
    from engine.autotune import messages as M
    from engine.autotune import profiles, search
    from engine.generation.session import LoadOptions, Session
    from engine.hardware.probe import probe

    def emit(message: M.Message) -> None:
        if args.jsonl:
            print(M.encode(message), flush=True)

    report = probe()
    fingerprint = report.fingerprint()
    engine_key = str(report.engine.get("cache_key") or report.engine.get("llama_cpp_python"))
    emit(M.HardwareMessage(fingerprint, report.cpu_model, report.cores, report.engine.get("backend")))
    session = Session(LoadOptions(path=str(args.model), n_ctx=2048, n_threads=args.threads,
                                  sidecar=str(args.sidecar) if args.sidecar else None))
    try:
        prompts = [[{"role": "user", "content": text}] for _, text in load_prompts(args.prompts)]
        settings = None
        if session.drafter and args.n_max:
            settings = [s for s in search.candidates(session.drafter.n_heads, session.drafter.chained)
                        if not s.enabled or s.n_max <= args.n_max]
        emit(M.ModelMessage(session.n_heads, session.mtp_status, session.rollback_strategy))
        result = search.tune(session, prompts, max_tokens=args.tokens, settings=settings,
                             progress=(lambda p: emit(M.ProgressMessage(**p))) if args.jsonl else None)
    finally:
        session.close()
    best = next(m for m in result.measurements if m.setting == result.best)
    if not args.no_save:
        store = profiles.ProfileStore(paths.data_dir() / "autotune-profiles.json")
        store.save(profiles.new_profile(fingerprint, str(args.model), engine_key, result.best,
                                        best.mean_ratio, result.reason))
    if args.jsonl:
        emit(M.ResultMessage(result.best, result.best.label, result.reason, rows=[
            M.ResultRow(m.setting.label, m.mean_tps, m.mean_ratio, m.lower_bound, m.acceptance, len(m.tps),
                        m.identical, m.identity, m.dropped_after is not None, m.per_pos)
            for m in result.measurements]))
        return 0
    print(result.table())
    print(f"\ndecision: {result.best.label}. {result.reason}")
    if not args.no_save:
        print(f"saved as the profile for this machine ({fingerprint}), model and engine build.")
    sys.stdout.flush()
    return 0
