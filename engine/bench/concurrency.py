"""``mtp-studio bench-concurrency``: several requests at once, ours against
llama.cpp's own ``llama-server``, MTP on and off.

For each number of concurrent clients N (1, 2, 4, 8), each server is started
with ``--parallel N`` on the same GGUF, the same per-sequence context and the
same thread count, warmed up with one request, and then N streaming clients
each send their requests back to back (greedy, the same prompts for every
server). Per server and N: total tokens/s over the wall time, time to first
token p50 / p95 as the clients see it, the server's CPU time per token (its
process and children: for ours the worker too; other load on the machine
barely moves it, unlike wall time), and acceptance per sequence (each
client's drafted and accepted tokens, from our ``speculative`` extension or
llama-server's ``timings.draft_n`` / ``draft_n_accepted``). ``--system W``
begins every prompt with one preamble of W words, as an agent's requests share
a system prompt; ``--own W`` begins each client's prompts with a preamble of
its own (long conversations that share nothing with each other).

The clients are threads of a child process (``python -m
engine.bench.concurrency``), as real clients are other processes; the
servers are child processes too, on loopback (engine/bench/servers.py).
docs/benchmarks.md ("Several requests at once") has figures and how to read
them.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.bench import servers
from engine.bench.child import JsonChild

PROMPTS = ["The history of the river valley", "A letter about the rain", "Notes on building a small boat",
           "Why the cloud came back", "The window and the old letter", "A map of the northern hills",
           "The baker's morning", "How the bridge was built"]


def prompt_for(client: int, request: int, system: int = 0, own: int = 0) -> str:
    """Client k's j-th prompt: the same for every server; after a preamble of ``system`` words every prompt
    shares (an agent's system prompt), where asked, a start only this client's prompts share, as a
    conversation's turns do.

    What a server reuses then does not depend on when replies end: a client's next request finds its start
    in the sequence that ran its last one, which is free by then. (Prompts whose starts each matched another
    client's earlier prompt let a server reuse more when every reply ended in the same step, as MTP off does,
    than when replies ended apart, as drafting's do: adaptive depth read 1,108 prompt tokens of 2,208 where
    MTP off read 920, the same run.) ``own``: words of a preamble only this client's prompts begin with."""
    return (f"{preamble(system)}{own_preamble(client, own)}Client {client + 1}, "
            f"{PROMPTS[client % len(PROMPTS)]}, part {request + 1}:")


def preamble(words: int) -> str:
    """A system prompt of ``words`` words, the same for every client and server ("" for 0)."""
    if words <= 0:
        return ""
    pool = " ".join(PROMPTS).replace("'", "").lower().split()
    return "You are a careful writer. " + " ".join(pool[k % len(pool)] for k in range(words)) + ".\n\n"


def own_preamble(client: int, words: int) -> str:
    """A preamble of ``words`` words only client ``client``'s prompts begin with ("" for 0): its words drawn in
    an order of its own, from its first word on, so that no two clients' prompts share a start."""
    if words <= 0:
        return ""
    pool = " ".join(PROMPTS).replace("'", "").lower().split()
    step = 2 * client + 1  # odd steps through an even-sized pool: a different order per client
    return f"Conversation {client + 1}. " + " ".join(pool[(client + k * step) % len(pool)]
                                                     for k in range(words)) + ".\n\n"


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) with linear interpolation between the closest ranks (numpy's default)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def rate(accepted: int, drafted: int) -> float | None:
    return accepted / drafted if drafted else None


@dataclass
class LoadFigures:
    """What one server did under N clients."""

    clients: int
    requests: int
    tokens: int
    wall_s: float
    total_tps: float
    ttft_p50_s: float
    ttft_p95_s: float
    drafted: int
    accepted: int
    per_sequence: list[float | None] = field(default_factory=list)  # each client's acceptance, in client order
    server_cpu_s: float = 0.0  # CPU time the server (and its worker) spent on the run
    prompt_tokens: int = 0  # every request's prompt tokens
    cached: int = 0  # of those, what the server reused rather than read

    @property
    def cpu_ms_per_token(self) -> float:
        return 1000 * self.server_cpu_s / self.tokens if self.tokens else math.nan

    @property
    def acceptance(self) -> float | None:
        return rate(self.accepted, self.drafted)

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "acceptance": self.acceptance, "cpu_ms_per_token": self.cpu_ms_per_token}


def summarize(records: list[dict[str, Any]], wall_s: float, clients: int, server_cpu_s: float = 0.0) -> LoadFigures:
    """Figures from one load run: ``records`` are completions (``servers.Completion.to_json()``) with
    their ``client`` index. Acceptance per sequence is per client: a client's requests all ran in one
    slot at a time, and a slot that drafts badly (llama.cpp's slots above 0, #27572) shows there."""
    tokens = sum(r["tokens"] for r in records)
    per_client = [[r for r in records if r["client"] == k] for k in range(clients)]
    return LoadFigures(
        clients=clients, requests=len(records), tokens=tokens, wall_s=wall_s,
        total_tps=tokens / wall_s if wall_s > 0 else 0.0,
        ttft_p50_s=percentile([r["ttft"] for r in records], 0.5),
        ttft_p95_s=percentile([r["ttft"] for r in records], 0.95),
        drafted=sum(r["drafted"] for r in records), accepted=sum(r["accepted"] for r in records),
        per_sequence=[rate(sum(r["accepted"] for r in rs), sum(r["drafted"] for r in rs)) for rs in per_client],
        server_cpu_s=server_cpu_s,
        prompt_tokens=sum(r.get("prompt_tokens", 0) for r in records),
        cached=sum(r.get("cached", 0) for r in records),
    )


def format_acceptance(fig: LoadFigures) -> str:
    """Overall acceptance and the per-sequence spread: ``62 % (58–66)``; ``–`` when nothing was drafted."""
    if fig.acceptance is None:
        return "–"
    seqs = [a for a in fig.per_sequence if a is not None]
    spread = f" ({100 * min(seqs):.0f}–{100 * max(seqs):.0f})" if len(seqs) > 1 else ""
    return f"{100 * fig.acceptance:.0f} %{spread}"


@dataclass
class Repeated:
    """One server under N clients over the run's rounds: its figures, and each round's total tokens/s over
    the same round's first server's (ours, MTP off), run just before it. A ratio of neighbours in time holds
    where this machine's speed drifts between rounds (by up to 1.3x within minutes here)."""

    figs: list[LoadFigures]
    ratios: list[float]

    def median(self, value: Callable[[LoadFigures], float]) -> float:
        return statistics.median(value(f) for f in self.figs)

    def pooled(self) -> LoadFigures:
        """Acceptance over every round (drafted and accepted summed), with every round's per-sequence rates
        for the spread."""
        first = self.figs[0]
        return LoadFigures(first.clients, sum(f.requests for f in self.figs), sum(f.tokens for f in self.figs),
                           sum(f.wall_s for f in self.figs), 0.0, 0.0, 0.0, sum(f.drafted for f in self.figs),
                           sum(f.accepted for f in self.figs), [a for f in self.figs for a in f.per_sequence])


def format_table(rows: list[tuple[int, str, Repeated, str]]) -> str:
    """Markdown: one row per (N, server), medians over the rounds (with the range of tokens/s where there were
    several); the ratio column is the median of each round's ratio to ours with MTP off; the last column
    says whether the texts match the reference's."""
    out = ["| clients | server | total tok/s | × ours off | TTFT p50 | TTFT p95 | acceptance (per sequence) | "
           "server CPU per token | prompt tokens read | texts |",
           "|---:|---|---:|---:|---:|---:|---|---:|---:|---|"]
    for n, label, rep, same in rows:
        tps = f"{rep.median(lambda f: f.total_tps):.1f}"
        if len(rep.figs) > 1:
            tps += f" ({min(f.total_tps for f in rep.figs):.0f}–{max(f.total_tps for f in rep.figs):.0f})"
        out.append(f"| {n} | {label} | {tps} | {statistics.median(rep.ratios):.2f} | "
                   f"{1000 * rep.median(lambda f: f.ttft_p50_s):.0f} ms | "
                   f"{1000 * rep.median(lambda f: f.ttft_p95_s):.0f} ms | {format_acceptance(rep.pooled())} | "
                   f"{rep.median(lambda f: f.cpu_ms_per_token):.1f} ms | "
                   f"{rep.median(lambda f: f.prompt_tokens - f.cached):.0f} of {rep.figs[0].prompt_tokens} | {same} |")
    return "\n".join(out)


def texts_match(records: list[dict[str, Any]], reference: dict[str, str]) -> str:
    """How many of these completions have the text the reference server gave for the same prompt."""
    compared = [r for r in records if r["prompt"] in reference]
    if not compared:
        return "reference"
    same = sum(r["text"] == reference[r["prompt"]] for r in compared)
    return f"{same}/{len(compared)} same"


class _Clients(JsonChild):
    """The client process (engine/bench/child.py): N clients' requests per command."""

    def __init__(self) -> None:
        super().__init__("engine.bench.concurrency")

    def load(self, port: int, clients: int, requests: int, max_tokens: int,
             system: int = 0, own: int = 0) -> tuple[list[dict[str, Any]], float]:
        answer = self.ask({"port": port, "clients": clients, "requests": requests, "max_tokens": max_tokens,
                           "system": system, "own": own})
        if "error" in answer:
            raise RuntimeError(f"a client failed: {answer['error']}")
        return answer["records"], answer["wall"]


def _client_main() -> None:
    for line in sys.stdin:
        cmd = json.loads(line)
        records: list[dict[str, Any]] = []
        errors: list[str] = []
        lock = threading.Lock()

        def client(k: int, cmd: dict[str, Any] = cmd, records: list[dict[str, Any]] = records,
                   errors: list[str] = errors, lock: threading.Lock = lock) -> None:
            for j in range(cmd["requests"]):
                prompt = prompt_for(k, j, cmd.get("system", 0), cmd.get("own", 0))
                try:
                    done = servers.complete(cmd["port"], prompt, cmd["max_tokens"])
                except Exception as exc:  # reported to the parent, which stops the run
                    with lock:
                        errors.append(f"client {k}: {exc}")
                    return
                with lock:
                    records.append({**done.to_json(), "client": k, "request": j, "prompt": prompt})

        t0 = time.perf_counter()
        threads = [threading.Thread(target=client, args=(k,)) for k in range(cmd["clients"])]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        answer = {"error": "; ".join(errors)} if errors else {"records": records, "wall": wall}
        print(json.dumps(answer), flush=True)


def _texts_over_rounds(per_round: list[str]) -> str:
    """``texts_match`` over the rounds: ``reference``, or how many completions matched in all."""
    counted = [x.split()[0].split("/") for x in per_round if x != "reference"]
    if not counted:
        return "reference"
    return f"{sum(int(a) for a, _ in counted)}/{sum(int(b) for _, b in counted)} same"


def _default_model() -> str:
    """The bench-size glm4moe with Qwen's vocabulary (151,936 tokens), mixed weights, a head reading the
    hidden state: the model docs/benchmarks.md's real-vocabulary figures use."""
    from engine.synth import HeadMap, SynthModel, SynthSpec

    return str(SynthModel(SynthSpec(arch="glm4moe", size="bench-152k", n_heads=1, weights="mixed",
                                    heads=(HeadMap("hidden", 0.7),))).path())


def run(args: argparse.Namespace) -> int:
    model = args.model or _default_model()
    counts = [int(x) for x in args.clients.split(",") if x]
    binary = servers.llama_server_binary(args.llama_server)
    pool = {"one": True, "per-sequence": False}.get(args.kv_pool)  # None: each server's default
    configs = [servers.ServerSpec("ours", model, n_ctx=args.ctx, threads=args.threads, n_max=0, kv_unified=pool),
               servers.ServerSpec("ours", model, n_ctx=args.ctx, threads=args.threads, n_max=args.n_max,
                                  draft_vocab=args.draft_vocab, kv_unified=pool)]
    if args.adaptive:
        configs.append(servers.ServerSpec("ours", model, n_ctx=args.ctx, threads=args.threads, n_max=args.n_max,
                                          adaptive=True, draft_vocab=args.draft_vocab, kv_unified=pool))
    if binary is None or not binary.exists():
        print("(llama-server not built: `python packaging/build_reference_driver.py --server`; ours only)",
              flush=True)
    else:
        extra = tuple(args.llama_server_arg)
        configs += [servers.ServerSpec("llama-server", model, n_ctx=args.ctx, threads=args.threads, n_max=0,
                                       binary=str(binary), extra=extra, kv_unified=pool),
                    servers.ServerSpec("llama-server", model, n_ctx=args.ctx, threads=args.threads,
                                       n_max=args.n_max, binary=str(binary), extra=extra, kv_unified=pool)]
    print(f"# several requests at once — {time.strftime('%Y-%m-%d %H:%M')}, {Path(model).parent.name}/"
          f"{Path(model).name}; {args.threads} thread(s) per server, {args.ctx} tokens of context per sequence, "
          f"{args.requests} request(s) of {args.max_tokens} tokens per client, greedy"
          + (f", a {args.system}-word system prompt shared by every request" if args.system else "")
          + (f", a {args.own}-word preamble of each client's own" if args.own else "")
          + (f", {args.parallel} sequences per server" if args.parallel else ""), flush=True)
    rows: list[tuple[int, str, Repeated, str]] = []
    dump: list[dict[str, Any]] = []
    clients = _Clients()
    try:
        for n in counts:
            reference: dict[str, str] = {}
            reps = [Repeated([], []) for _ in configs]
            sames = [[] for _ in configs]  # type: list[list[str]]
            for round_no in range(args.rounds):  # every server once per round, in the same order
                for i, base in enumerate(configs):
                    spec = servers.ServerSpec(**{**base.__dict__, "parallel": args.parallel or n})
                    with servers.RunningServer(spec) as server:
                        servers.complete(server.port, "warm up", 8)
                        cpu0 = server.cpu_seconds()
                        records, wall = clients.load(server.port, n, args.requests, args.max_tokens,
                                                     args.system, args.own)
                        cpu = server.cpu_seconds() - cpu0
                    fig = summarize(records, wall, n, cpu)
                    same = texts_match(records, reference)
                    if not reference:
                        reference = {r["prompt"]: r["text"] for r in records}
                    reps[i].figs.append(fig)
                    reps[i].ratios.append(fig.total_tps / reps[0].figs[-1].total_tps)
                    sames[i].append(same)
                    dump.append({"clients": n, "server": spec.label, "round": round_no + 1, **fig.to_json(),
                                 "texts": same})
                    print(f"{n} client(s), {spec.label}"
                          + (f", round {round_no + 1}" if args.rounds > 1 else "")
                          + f": {fig.total_tps:.1f} tok/s ({reps[i].ratios[-1]:.2f}x ours off), TTFT p50 "
                          f"{1000 * fig.ttft_p50_s:.0f} ms, p95 {1000 * fig.ttft_p95_s:.0f} ms, acceptance "
                          f"{format_acceptance(fig)}, {fig.tokens} tokens in {fig.wall_s:.1f} s, server CPU "
                          f"{fig.cpu_ms_per_token:.1f} ms/token, prompt tokens read "
                          f"{fig.prompt_tokens - fig.cached} of {fig.prompt_tokens}; texts {same}",
                          flush=True)
            for base, rep, same_rounds in zip(configs, reps, sames, strict=True):
                rows.append((n, base.label, rep, _texts_over_rounds(same_rounds)))
    finally:
        clients.close()
    print()
    print(json.dumps(dump, indent=2) if args.json else format_table(rows))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench-concurrency",
                       help="1, 2, 4, 8 concurrent clients: mtp-studio serve vs llama-server, MTP on and off")
    p.add_argument("model", nargs="?", help="a GGUF with an MTP head (default: the synthetic bench-152k glm4moe)")
    p.add_argument("--clients", default="1,2,4,8", help="comma-separated numbers of concurrent clients")
    p.add_argument("--requests", type=int, default=2, help="requests each client sends, back to back")
    p.add_argument("--rounds", type=int, default=1,
                   help="run every server this many times per client count, in turn; the table shows medians "
                        "and each round's ratio to ours with MTP off (a noisy machine's drift cancels)")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--system", type=int, default=0, metavar="WORDS",
                   help="begin every prompt with the same preamble of this many words (an agent's system prompt)")
    p.add_argument("--own", type=int, default=0, metavar="WORDS",
                   help="begin each client's prompts with a preamble of this many words of its own (long "
                        "conversations that share nothing)")
    p.add_argument("--ctx", type=int, default=1024, help="context per sequence, both servers")
    p.add_argument("--kv-pool", choices=("one", "per-sequence"), default=None,
                   help="both servers keep one pool of cells for every sequence, or a pool each (default: each "
                        "server's own: ours one pool, llama-server --parallel N a pool each; docs/parallel.md)")
    p.add_argument("--threads", type=int, default=1, help="threads per server")
    p.add_argument("--n-max", type=int, default=3, help="MTP draft depth, both servers (p_min 0)")
    p.add_argument("--adaptive", action="store_true", help="also ours with adaptive depth (at most --n-max)")
    p.add_argument("--draft-vocab", type=int, default=0, metavar="N",
                   help="ours' MTP head drafts only among token ids below N (patch 0008; 0: the whole vocabulary)")
    p.add_argument("--parallel", type=int, default=None,
                   help="sequences each server holds (default: as many as clients; more shows what a server "
                        "started with `serve`'s default of 4 costs fewer clients)")
    p.add_argument("--llama-server", help="llama-server binary (default: the one build_reference_driver.py "
                   "--server built for this engine)")
    servers.add_llama_server_args(p)
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.set_defaults(func=run)


if __name__ == "__main__":
    _client_main()
