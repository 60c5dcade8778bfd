"""Time to first token across a conversation, with and without prefix reuse.

A conversation grows by a reply and a paragraph a turn. Without reuse every
turn prefills the whole conversation again, so the first token comes later
and later; with reuse (engine/generation/prefix_cache.py) a turn prefills
only its new text. Both passes send the same prompts (greedy replies, so the
same text); then the last prompt is sent twice, as a regenerate does; then
another conversation cuts this one and it goes on, or its last reply is
regenerated, with its state kept in host memory (engine/generation/state_cache.py)
and without.

With ``--llama-server`` the same prompts then go, turn by turn, as streamed
``/v1/completions`` to ``mtp-studio serve`` and to llama.cpp's own
``llama-server`` (``cache_prompt`` on; built from the same patched source by
``packaging/build_reference_driver.py --server``), both running, each turn to
one and then the other, and their times to first token are printed side by
side: both over HTTP, so neither is favoured by being in-process, and a turn
apart, so neither by the machine's drift (engine/bench/servers.py).

    mtp-studio bench-conversation [--model F] [--turns 20] [--mtp] [--ngram] [--llama-server [PATH]]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from dataclasses import dataclass

from engine.bench import servers
from engine.generation.generator import GenerateRequest, generate
from engine.generation.session import LoadOptions, Session
from engine.speculative.settings import MTP, SPECULATION_OFF, SpeculativeSettings, mtp, ngram

PARAGRAPHS = (
    "The river ran past the old mill and under the stone bridge, where the children stopped to watch the water.",
    "In the evening the market square filled with stalls selling bread, cheese, apples and small clay pots.",
    "A letter arrived from the city, asking whether the mill could grind grain for the winter months.",
    "The miller read it twice, folded it into his coat, and walked down to the water to think it over.",
    "Snow came early that year, and the road to the city was closed for three weeks in a row.",
)


@dataclass
class Turn:
    prompt_tokens: int
    reused: int
    ttft_s: float


def _ttft(session: Session, prompt: str, tokens: int, spec: SpeculativeSettings, reuse: bool) -> tuple[Turn, str]:
    if not reuse:
        session.prefix.forget()
        session.states.clear()
    t0 = time.perf_counter()
    result = generate(session, GenerateRequest(prompt=prompt, max_tokens=tokens, speculative=spec))
    first = result.stats.t_first_token if result.stats.t_first_token is not None else time.perf_counter()
    return Turn(result.stats.prompt_tokens, result.stats.prompt_reused, first - t0), result.text


def conversation(session: Session, turns: int, tokens: int, spec: SpeculativeSettings, reuse: bool,
                 prompts: list[str] | None = None) -> list[Turn]:
    """The turns' figures; each turn's prompt is appended to ``prompts`` when given (to replay over HTTP)."""
    prompt, rows = "", []
    for k in range(turns):
        prompt += ("\n\n" if prompt else "") + PARAGRAPHS[k % len(PARAGRAPHS)]
        if prompts is not None:
            prompts.append(prompt)
        turn, reply = _ttft(session, prompt, tokens, spec, reuse)
        rows.append(turn)
        prompt += reply
    return rows


# a prompt that begins unlike every turn of the conversation, so its first send finds nothing to reuse
TWICE_PROMPT = "\n\n".join(reversed(PARAGRAPHS)) * 2


def switch_and_back(session: Session, conversation_prompt: str, tokens: int, spec: SpeculativeSettings,
                    keep: bool, regenerate: bool = False) -> Turn:
    """The conversation, another one that cuts it, then the conversation's next turn (its reply, then a
    paragraph), or with ``regenerate`` its last reply again; that turn's figures, with the cut conversation
    kept in host memory (``keep``: engine/generation/state_cache.py) or not. (On a sliding-window model a
    regenerated reply goes back to the window checkpoint kept at the prompt's end.)"""
    reply = _ttft(session, conversation_prompt, tokens, spec, reuse=True)[1]
    session.states.clear()  # an earlier repeat's way back, kept, would make this one the same prompt twice
    _ttft(session, TWICE_PROMPT, tokens, spec, reuse=True)
    if not keep:
        session.states.clear()
    then = conversation_prompt if regenerate else conversation_prompt + reply + "\n\n" + PARAGRAPHS[0]
    return _ttft(session, then, tokens, spec, reuse=True)[0]


@dataclass
class ServedTurns:
    """One server's replay of the conversation: per turn the completion; then the same prompt twice."""

    label: str
    turns: list[servers.Completion]
    twice: tuple[float, float]


def replay(spec: servers.ServerSpec, prompts: list[str], tokens: int) -> ServedTurns:
    """Send the recorded prompts to a freshly started server, one turn after the other (greedy, so its
    replies are the ones the next prompts contain and its cache holds them)."""
    return replay_side_by_side([spec], prompts, tokens)[0]


def replay_side_by_side(specs: list[servers.ServerSpec], prompts: list[str], tokens: int) -> list[ServedTurns]:
    """:func:`replay` on every server at once, turn by turn: each turn goes to every server before the
    next turn goes to any, the first server changing every turn. This machine's speed drifts by more than
    the differences measured within minutes (docs/benchmarks.md); servers replayed one after the other
    were compared at different times, and one turn apart they are compared at the same time. An idle
    server costs the other nothing (both wait on a socket)."""
    with contextlib.ExitStack() as stack:
        running = [stack.enter_context(servers.RunningServer(spec)) for spec in specs]
        for server in running:
            servers.complete(server.port, "warm up", 4)
        turns: list[list[servers.Completion]] = [[] for _ in specs]
        for k, prompt in enumerate([*prompts, TWICE_PROMPT, TWICE_PROMPT]):
            order = list(range(len(specs)))
            order = order[k % len(order):] + order[:k % len(order)]
            for i in order:
                turns[i].append(servers.complete(running[i].port, prompt, tokens))
    return [ServedTurns(spec.label, t[:-2], (t[-2].ttft, t[-1].ttft)) for spec, t in zip(specs, turns, strict=True)]


def verdict(rows: list[ServedTurns]) -> str:
    """The last server against the first, turn by turn: where each was quicker, the median ratio of their
    TTFTs, and each one's time outside its own prompt decode (TTFT less ``timings.prompt_ms``: the
    request's way in and the first token's way out)."""
    ours, theirs = rows[0], rows[-1]
    ratios = [b.ttft / a.ttft for a, b in zip(ours.turns, theirs.turns, strict=True) if a.ttft > 0]
    quicker = sum(r > 1 for r in ratios)

    def outside(r: ServedTurns) -> str:
        ms = sorted(1000 * t.ttft - t.prompt_ms for t in r.turns)
        return f"{statistics.median(ms):.1f} ms (range {ms[0]:.1f}-{ms[-1]:.1f})"

    return (f"{ours.label} quicker at {quicker} of {len(ratios)} turns; median {theirs.label} / {ours.label} "
            f"TTFT {statistics.median(ratios):.2f}x\n"
            f"outside the prompt's decode, median: {ours.label} {outside(ours)}, {theirs.label} {outside(theirs)}")


def format_served(rows: list[ServedTurns]) -> str:
    """Markdown, one row per turn: each server's reused prompt tokens, TTFT and its own prompt time
    (``timings.prompt_ms``: the decode of the new tokens; the rest of TTFT is the request's way in and the
    first token's way out), and the last server's TTFT over the first's."""
    head = "| turn | prompt tokens | " + " | ".join(f"{r.label}: reused | {r.label}: TTFT | {r.label}: prompt"
                                                   for r in rows)
    ratio = len(rows) > 1
    out = [head + (f" | {rows[-1].label} / {rows[0].label} |" if ratio else " |"),
           "|" + "---:|" * (2 + 3 * len(rows) + ratio)]
    for k in range(len(rows[0].turns)):
        cells = [str(k + 1), str(rows[0].turns[k].prompt_tokens)]
        for r in rows:
            cells += [str(r.turns[k].cached), f"{1000 * r.turns[k].ttft:.0f} ms", f"{r.turns[k].prompt_ms:.0f} ms"]
        if ratio:
            a, b = rows[0].turns[k].ttft, rows[-1].turns[k].ttft
            cells.append(f"{b / a:.2f}x" if a else "–")
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def run(args: argparse.Namespace) -> int:
    from engine import default_model

    path = args.model or str(default_model.default_model_path())
    session = Session(LoadOptions(path=path, n_ctx=args.n_ctx, n_threads=args.threads,
                                  n_gpu_layers=args.gpu_layers, swa_full=args.swa_full))
    try:
        spec = SPECULATION_OFF
        if args.mtp and session.mtp_drafter is not None:
            spec = ngram(args.n_max, mtp_too=True) if args.ngram else mtp(args.n_max)
        elif args.ngram:
            spec = ngram(args.n_max)
        print(f"# conversation, {args.turns} turns, {args.tokens} tokens a reply, {spec.label} — {path}", flush=True)
        prompts: list[str] = []
        with_reuse = conversation(session, args.turns, args.tokens, spec, reuse=True, prompts=prompts)
        without = conversation(session, args.turns, args.tokens, spec, reuse=False)
        print(f"{'turn':>4} {'prompt':>7} {'reused':>7} {'TTFT reuse':>11} {'TTFT none':>10} {'none/reuse':>10}")
        for k, (a, b) in enumerate(zip(with_reuse, without, strict=True), 1):
            print(f"{k:4d} {a.prompt_tokens:7d} {a.reused:7d} {1000 * a.ttft_s:9.0f}ms {1000 * b.ttft_s:8.0f}ms "
                  f"{b.ttft_s / a.ttft_s if a.ttft_s else 0:9.2f}x")
        first_new = with_reuse[0].prompt_tokens
        last = with_reuse[-1]
        print(f"turn {len(with_reuse)} against turn 1 with reuse: {last.ttft_s / with_reuse[0].ttft_s:.2f}x "
              f"({last.prompt_tokens - last.reused} new tokens against {first_new})")
        # the same prompt twice (a regenerated reply): the second pays for one token
        prompt = "\n\n".join(PARAGRAPHS) * 2
        cold = [_ttft(session, prompt, args.tokens, spec, reuse=False)[0].ttft_s for _ in range(3)]
        warm = []
        for _ in range(3):
            _ttft(session, prompt, args.tokens, spec, reuse=False)
            warm.append(_ttft(session, prompt, args.tokens, spec, reuse=True)[0].ttft_s)
        print(f"same prompt twice: first {1000 * statistics.median(cold):.0f} ms, second "
              f"{1000 * statistics.median(warm):.0f} ms ({statistics.median(warm) / statistics.median(cold):.0%})")
        # back to the conversation after another one (its next turn, or its last reply regenerated): its state
        # from host memory, or its whole prefill
        for what, regenerate in (("back to the conversation", False), ("its last reply regenerated", True)):
            kept, lost = [], []
            for _ in range(3):
                kept.append(switch_and_back(session, prompts[-1], args.tokens, spec, keep=True, regenerate=regenerate))
                lost.append(switch_and_back(session, prompts[-1], args.tokens, spec, keep=False,
                                            regenerate=regenerate))
            a, b = (statistics.median(t.ttft_s for t in runs) for runs in (kept, lost))
            print(f"{what} after another ({kept[0].prompt_tokens} prompt tokens): "
                  f"{1000 * a:.0f} ms with its state kept in host memory (reused {kept[0].reused}), "
                  f"{1000 * b:.0f} ms without (reused {lost[0].reused}) ({a / b:.0%})", flush=True)
    finally:
        session.close()
    if args.llama_server is not None:
        if spec.enabled and spec.mode != MTP:
            print("\n(over HTTP both servers run without speculation: only MTP alone is compared there)")
        _servers(args, path, prompts, spec.mode == MTP)
    return 0


def _servers(args: argparse.Namespace, path: str, prompts: list[str], mtp_on: bool) -> None:
    binary = servers.llama_server_binary(args.llama_server or None)
    if binary is None or not binary.exists():
        print("\n(llama-server not built: `python packaging/build_reference_driver.py --server`)", flush=True)
        return
    n_max = args.n_max if mtp_on else 0
    specs = [servers.ServerSpec("ours", path, n_ctx=args.n_ctx, threads=args.threads, n_max=n_max,
                                swa_full=args.swa_full),
             servers.ServerSpec("llama-server", path, n_ctx=args.n_ctx, threads=args.threads, n_max=n_max,
                                binary=str(binary), extra=tuple(args.llama_server_arg), swa_full=args.swa_full)]
    print(f"\n# the same {len(prompts)} prompts over HTTP (streamed /v1/completions, cache_prompt on), "
          f"{args.threads} thread(s) each", flush=True)
    rows = replay_side_by_side(specs, prompts, args.tokens)
    print(format_served(rows))
    print(verdict(rows))
    for r in rows:
        first, last = r.turns[0], r.turns[-1]
        print(f"{r.label}: turn {len(r.turns)} against turn 1: {last.ttft / first.ttft:.2f}x; same prompt "
              f"twice: {1000 * r.twice[0]:.0f} ms, then {1000 * r.twice[1]:.0f} ms "
              f"({r.twice[1] / r.twice[0]:.0%})")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench-conversation", help="time to first token per turn, with and without prefix reuse")
    p.add_argument("--model", help="a GGUF (default: the built-in model)")
    p.add_argument("--turns", type=int, default=20)
    p.add_argument("--tokens", type=int, default=24, help="tokens a reply")
    p.add_argument("--n-ctx", type=int, default=8192)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--gpu-layers", type=int, default=0)
    p.add_argument("--mtp", action="store_true", help="draft with the model's MTP head")
    p.add_argument("--ngram", action="store_true", help="draft n-grams (with --mtp: MTP + n-gram)")
    p.add_argument("--n-max", type=int, default=3)
    p.add_argument("--swa-full", action="store_true",
                   help="a sliding-window model keeps every cell of its windowed layers: ours and llama-server")
    p.add_argument("--llama-server", nargs="?", const="", default=None, metavar="PATH",
                   help="then replay the prompts over HTTP to mtp-studio serve and llama-server (default PATH: "
                   "the one build_reference_driver.py --server built)")
    servers.add_llama_server_args(p)
    p.set_defaults(func=run)
