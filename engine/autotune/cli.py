"""``mtp-studio autotune MODEL``: measure, decide, remember; print the table."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from engine import paths
from engine.sampling import DEFAULT_PRESET, GREEDY, GREEDY_KEY, PRESETS, SamplingParams

if TYPE_CHECKING:
    from engine.autotune import concurrency, messages, search

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
    p.add_argument("--sampling", default=DEFAULT_PRESET,
                   help="the sampling to time with, as the chat will reply: greedy, precise, balanced, creative "
                        "(default: %(default)s, the chat's default) or a JSON object of sampling fields; the "
                        "identity check stays greedy")
    p.add_argument("--concurrency", default="1",
                   help="how many sequences at once to tune for, comma-separated (e.g. 1,2,4; default 1): for "
                        "each N above 1, total tokens/s of N requests together, the choice stored per N for "
                        "'serve --parallel N'")
    p.add_argument("--concurrency-rounds", type=int, default=3, help="rounds of N prompts per setting and N")
    p.add_argument("--no-save", action="store_true", help="do not store the profile")
    p.add_argument("--jsonl", action="store_true", help="progress and result as JSON lines (for the GUI)")
    p.set_defaults(func=run)


def load_prompts(n: int) -> list[tuple[str, str]]:
    data = json.loads(PROMPT_SUITE.read_text())
    return [(p["category"], p["text"]) for p in data["prompts"]][:n]


def parse_sampling(text: str) -> SamplingParams:
    """``--sampling``: a preset's name or a JSON object of :class:`SamplingParams` fields.

    Raises:
        ValueError: neither, or a value out of range (the message says which).
    """
    named = {GREEDY_KEY: GREEDY, **PRESETS}
    if text in named:
        return named[text]
    try:
        fields = json.loads(text)
    except ValueError:
        raise ValueError(f"--sampling must be one of {', '.join(named)} or a JSON object, not {text!r}") from None
    if not isinstance(fields, dict):
        raise ValueError(f"--sampling must be one of {', '.join(named)} or a JSON object, not {text!r}")
    return SamplingParams(**fields)


def parse_concurrency(text: str) -> list[int]:
    """``--concurrency``: sequence counts, 1 always among them (the single-sequence search)."""
    counts = sorted({1, *(int(x) for x in text.split(",") if x.strip())})
    if counts[0] < 1:
        raise ValueError(f"--concurrency takes counts of 1 or more, not {text!r}")
    return counts


def run(args: argparse.Namespace) -> int:
    from engine.autotune import draft_vocab, profiles, search, threads
    from engine.autotune import messages as M
    from engine.generation.session import LoadOptions, Session
    from engine.hardware.probe import probe
    from engine.sampling import sampling_key, sampling_label

    def emit(message: M.Message) -> None:
        if args.jsonl:
            print(M.encode(message), flush=True)

    try:
        sampling, counts_at_once = parse_sampling(args.sampling), parse_concurrency(args.concurrency)
    except (ValueError, TypeError) as exc:
        print(f"autotune: {exc}", file=sys.stderr)
        return 2
    report = probe()
    fingerprint = report.fingerprint()
    engine_key = str(report.engine.get("cache_key") or report.engine.get("llama_cpp_python"))
    emit(M.HardwareMessage(fingerprint, report.cpu_model, report.cores, report.engine.get("backend")))
    store = profiles.ProfileStore(paths.data_dir() / "autotune-profiles.json")
    old = store.stale_for(str(args.model), "", "", "")  # every profile of this file
    if not args.jsonl and any(p.outdated for p in old):
        print(f"An existing profile for this model was {next(p for p in old if p.outdated).outdated_text}; "
              "tuning again.")
    session = Session(LoadOptions(path=str(args.model), n_ctx=1024, n_threads=args.threads,  # per sequence
                                  n_gpu_layers=args.gpu_layers, sidecar=str(args.sidecar) if args.sidecar else None))
    thread_choices = []
    vocab = None
    try:
        prompts = [[{"role": "user", "content": text}] for _, text in load_prompts(args.prompts)]
        emit(M.ModelMessage(session.n_heads, session.mtp_status, session.rollback_strategy))
        counts = _thread_options(args.thread_options)
        if counts:  # the target's threads first: every setting is then timed with them
            thread_choices.append(threads.choose(session, prompts[:3], counts, max_tokens=min(48, args.tokens)))
            emit(_threads_message(thread_choices[-1]))
        probe_spec = draft_vocab.timing_setting(session)
        if draft_vocab.worth_trying(session, probe_spec):  # before the search: the cut may be what makes MTP pay
            vocab = draft_vocab.choose(session, prompts[:3], probe_spec, max_tokens=min(48, args.tokens),
                                       sampling=sampling)
        settings = search.candidates_for(session, n_max_cap=args.n_max) if args.n_max else None
        if not args.jsonl:
            print(f"timing with {sampling_label(sampling_key(sampling))} sampling (seeded per prompt); "
                  "the identity check is greedy", flush=True)
        result = search.tune(session, prompts, max_tokens=args.tokens, settings=settings, sampling=sampling,
                             progress=(lambda p: emit(M.ProgressMessage(**p))) if args.jsonl else None)
        if counts and result.best.uses_mtp and session.mtp_drafter is not None:
            thread_choices.append(threads.choose(session, prompts[:3], [1, *counts], what="draft",
                                                 spec=result.best, max_tokens=min(48, args.tokens)))
            emit(_threads_message(thread_choices[-1]))
        deepest = min(session.max_draft, args.n_max or session.max_draft)  # adaptive depth's ceiling under N
    finally:
        session.close()
    at_once = _measure_concurrency(args, prompts, counts_at_once[1:], result, deepest, sampling, emit,
                                   vocab.draft_vocab if vocab else 0)
    best = next(m for m in result.measurements if m.setting == result.best)
    n_threads = thread_choices[0].threads if thread_choices else 0
    n_draft = thread_choices[1].threads if len(thread_choices) > 1 else 0
    if not args.no_save:
        chosen = {c.n: profiles.ConcurrencyChoice(c.best, c.speedup) for c in at_once}
        if chosen:  # N = 1 too, so the map reads whole
            chosen[1] = profiles.ConcurrencyChoice(result.best, best.mean_ratio)
        store.save(profiles.new_profile(fingerprint, str(args.model), engine_key, result.best,
                                        best.mean_ratio, result.reason, n_threads, n_draft, result.sampling,
                                        chosen, vocab.draft_vocab if vocab else None))
    if args.jsonl:
        emit(M.ResultMessage(result.best, result.best.label, result.reason, rows=[
            M.ResultRow(m.setting.label, m.mean_tps, m.mean_ratio, m.lower_bound, m.acceptance, len(m.tps),
                        m.identical, m.identity, m.dropped_after is not None, m.per_pos)
            for m in result.measurements], threads=n_threads, threads_draft=n_draft, sampling=result.sampling,
            draft_vocab=vocab.draft_vocab if vocab else None, draft_vocab_reason=vocab.reason if vocab else ""))
        return 0
    for choice in [*thread_choices, *([vocab] if vocab else [])]:
        print(choice.table())
        print(choice.reason + "\n")
    print(f"timed with {sampling_label(result.sampling)} sampling")
    print(result.table())
    print(f"\ndecision: {result.best.label}. {result.reason}")
    for c in at_once:
        print("\n" + c.table())
        print(f"decision for {c.n} at once: {c.best.label}. {c.reason}")
    if not args.no_save:
        print(f"saved as the profile for this machine ({fingerprint}), model and engine build.")
    sys.stdout.flush()
    return 0


def _measure_concurrency(args: argparse.Namespace, prompts: list[list[dict[str, str]]], counts: list[int],
                         result: search.TuneResult, deepest: int, sampling: SamplingParams,
                         emit: Callable[[messages.Message], None], draft_vocab: int = 0,
                         ) -> list[concurrency.ConcurrencyResult]:
    """For each N in ``counts``: the candidates timed N at once on a session that holds max(counts) sequences
    (with the draft vocabulary chosen alone)."""
    from engine.autotune import concurrency
    from engine.autotune import messages as M
    from engine.generation.session import LoadOptions, Session

    if not counts:
        return []
    settings = concurrency.candidates(result.finalists(), deepest)
    if len(settings) == 1:  # nothing but "off" to try: no head and no n-gram finalist
        return [concurrency.ConcurrencyResult(n, settings[0], [], "nothing to try; speculation stays off.")
                for n in counts]
    session = Session(LoadOptions(path=str(args.model), n_ctx=1024, n_threads=args.threads,  # per sequence
                                  n_gpu_layers=args.gpu_layers, sidecar=str(args.sidecar) if args.sidecar else None,
                                  parallel=max(counts), draft_vocab=draft_vocab))
    out = []
    try:
        for n in counts:
            c = concurrency.measure(session, prompts, n, settings, rounds=args.concurrency_rounds,
                                    max_tokens=min(48, args.tokens), sampling=sampling,
                                    progress=None if args.jsonl else lambda line: print(line, flush=True))
            out.append(c)
            emit(M.ConcurrencyMessage(n, c.best, c.reason, rows=[
                M.ConcurrencyRow(m.setting.label, m.mean_tps, m.mean_ratio, m.lower_bound) for m in c.measurements]))
    finally:
        session.close()
    return out


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
