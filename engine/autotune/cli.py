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
    p.add_argument("--threads", type=int, default=1, help="threads to load with: the baseline thread counts must beat")
    p.add_argument("--thread-options", default="auto",
                   help="thread counts to time, comma-separated (auto: 1, cores-1, cores, half; 'none': skip)")
    p.add_argument("--gpu-layers", type=int, default=0, help="layers on the GPU, as the chat loads them (999: all)")
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
    from engine.autotune import profiles, search, threads
    from engine.generation.session import LoadOptions, Session
    from engine.hardware.probe import probe

    def emit(message: M.Message) -> None:
        if args.jsonl:
            print(M.encode(message), flush=True)

    report = probe()
    fingerprint = report.fingerprint()
    engine_key = str(report.engine.get("cache_key") or report.engine.get("llama_cpp_python"))
    emit(M.HardwareMessage(fingerprint, report.cpu_model, report.cores, report.engine.get("backend")))
    store = profiles.ProfileStore(paths.data_dir() / "autotune-profiles.json")
    old = store.stale_for(str(args.model), "", "", "")  # every profile of this file
    if not args.jsonl and any(p.outdated for p in old):
        print(f"An existing profile for this model was {profiles.OUTDATED_TEXT}; tuning again.")
    session = Session(LoadOptions(path=str(args.model), n_ctx=2048, n_threads=args.threads,
                                  n_gpu_layers=args.gpu_layers, sidecar=str(args.sidecar) if args.sidecar else None))
    thread_choices = []
    try:
        prompts = [[{"role": "user", "content": text}] for _, text in load_prompts(args.prompts)]
        emit(M.ModelMessage(session.n_heads, session.mtp_status, session.rollback_strategy))
        counts = _thread_options(args.thread_options)
        if counts:  # the target's threads first: every setting is then timed with them
            thread_choices.append(threads.choose(session, prompts[:3], counts, max_tokens=min(48, args.tokens)))
            emit(_threads_message(thread_choices[-1]))
        settings = search.candidates_for(session, n_max_cap=args.n_max) if args.n_max else None
        result = search.tune(session, prompts, max_tokens=args.tokens, settings=settings,
                             progress=(lambda p: emit(M.ProgressMessage(**p))) if args.jsonl else None)
        if counts and result.best.uses_mtp and session.mtp_drafter is not None:
            thread_choices.append(threads.choose(session, prompts[:3], [1, *counts], what="draft",
                                                 spec=result.best, max_tokens=min(48, args.tokens)))
            emit(_threads_message(thread_choices[-1]))
    finally:
        session.close()
    best = next(m for m in result.measurements if m.setting == result.best)
    n_threads = thread_choices[0].threads if thread_choices else 0
    n_draft = thread_choices[1].threads if len(thread_choices) > 1 else 0
    if not args.no_save:
        store.save(profiles.new_profile(fingerprint, str(args.model), engine_key, result.best,
                                        best.mean_ratio, result.reason, n_threads, n_draft))
    if args.jsonl:
        emit(M.ResultMessage(result.best, result.best.label, result.reason, rows=[
            M.ResultRow(m.setting.label, m.mean_tps, m.mean_ratio, m.lower_bound, m.acceptance, len(m.tps),
                        m.identical, m.identity, m.dropped_after is not None, m.per_pos)
            for m in result.measurements], threads=n_threads, threads_draft=n_draft))
        return 0
    for choice in thread_choices:
        print(choice.table())
        print(choice.reason + "\n")
    print(result.table())
    print(f"\ndecision: {result.best.label}. {result.reason}")
    if not args.no_save:
        print(f"saved as the profile for this machine ({fingerprint}), model and engine build.")
    sys.stdout.flush()
    return 0


def _thread_options(text: str) -> list[int]:
    from engine.autotune import threads

    if text == "none":
        return []
    if text == "auto":
        return threads.options()
    return [int(x) for x in text.split(",") if x]


def _threads_message(choice):  # -> messages.ThreadsMessage
    from engine.autotune import messages as M

    return M.ThreadsMessage(choice.what, choice.threads, choice.baseline, choice.reason, rows=[
        M.ThreadRow(m.threads, sum(m.tps) / len(m.tps) if m.tps else 0.0, m.mean_ratio, m.lower_bound)
        for m in choice.measurements])
