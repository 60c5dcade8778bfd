"""``mtp-studio rpc-bench``: tok/s of one model local vs split across loopback RPC servers,
plain and with MTP, measured side by side in one run.

What it isolates: the cost the RPC hop adds per plain token (one graph
round trip per server per token) and per MTP verify batch (the same round
trips, shared by every drafted token in the batch). On a network the per-hop
cost is larger than on loopback, so MTP's gain grows, not shrinks, when
the trunk is remote: a verify batch of k+1 rows pays the round trips once.
The MTP head runs locally (engine/generation/placement.py), so drafting adds
no round trips. Ratios within one repeat are the figures to read; absolute
tok/s drift with the machine's load.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

from engine.rpc import parse_endpoints
from engine.rpc.probe import probe

PROMPT = " the river model"


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--arch", default="glm4moe")
    p.add_argument("--size", default="bench", help="synthetic model size (engine/synth/spec.py SIZES)")
    p.add_argument("--dense", action="store_true", help="dense FFN instead of MoE (a verify batch of MoE rows "
                                                         "reads more experts than one row does)")
    p.add_argument("--agree", type=float, default=0.8, help="head agreement of the synthetic MTP head")
    p.add_argument("--model", help="a GGUF to use instead of a synthetic model")
    p.add_argument("--servers", type=int, default=2, help="loopback ggml-rpc-server processes to start")
    p.add_argument("--rpc", help="use these running servers (host:port,…) instead of starting loopback ones")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="threads here and on each loopback server")
    p.add_argument("--n-max", type=int, default=3)
    p.add_argument("--binary", help="ggml-rpc-server to start (default: the one built with this engine)")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("rpc-bench", help="tok/s local vs split across loopback RPC servers, plain and MTP")
    add_args(p)
    p.set_defaults(func=run)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(binary: Path, n: int, threads: int) -> tuple[list[subprocess.Popen[bytes]], list[str]]:
    procs, endpoints = [], []
    for _ in range(n):
        port = _free_port()
        procs.append(subprocess.Popen([str(binary), "--host", "127.0.0.1", "--port", str(port),
                                       "--threads", str(threads)],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        endpoints.append(f"127.0.0.1:{port}")
    for endpoint in endpoints:
        deadline = time.monotonic() + 30
        while not probe(parse_endpoints(endpoint)[0], timeout_s=1).ok:
            if time.monotonic() > deadline:
                raise SystemExit(f"ggml-rpc-server at {endpoint} never answered")
            time.sleep(0.1)
    return procs, endpoints


def run(args: argparse.Namespace) -> int:
    from engine.generation.generator import GenerateRequest, generate
    from engine.generation.session import LoadOptions, Session
    from engine.rpc import server
    from engine.speculative.settings import SPECULATION_OFF, SpeculativeSettings
    from engine.synth import HeadMap, SynthModel, SynthSpec

    if args.model:
        path = Path(args.model)
        kind = path.name
    else:
        synth_spec = SynthSpec(arch=args.arch, size=args.size, weights="oracle", heads=(HeadMap("token", args.agree),),
                         dense=args.dense)
        path = SynthModel(synth_spec).path()
        kind = f"synthetic {args.arch}{' dense' if args.dense else ''} {args.size}, head agreement {args.agree}"
    procs: list[subprocess.Popen[bytes]] = []
    if args.rpc:
        endpoints = [str(e) for e in parse_endpoints(args.rpc)]
    else:
        binary = Path(args.binary) if args.binary else server.find_binary()
        procs, endpoints = _start(binary, args.servers, args.threads)
    mtp = SpeculativeSettings("mtp", args.n_max, 0, 0.0)
    try:
        base = LoadOptions(path=str(path), n_ctx=1024, n_threads=args.threads)
        sessions = {"local": Session(base),
                    "split": Session(LoadOptions(**{**base.__dict__, "rpc": tuple(endpoints)}))}
        print(f"# rpc-bench — {time.strftime('%Y-%m-%d %H:%M')}, {kind}, {args.tokens} tokens, "
              f"{args.threads} thread(s), {args.repeats} interleaved repeats; medians")
        placement = sessions["split"].placement
        print("split: " + "; ".join(placement.lines if placement else []))
        tps: dict[str, list[float]] = {}
        verify_ms: dict[str, list[float]] = {}
        tokens: dict[str, list[int]] = {}
        mean_len: dict[str, float] = {}
        for _ in range(args.repeats):
            for where, session in sessions.items():
                for how, spec in (("plain", SPECULATION_OFF), ("mtp", mtp)):
                    r = generate(session, GenerateRequest(prompt=PROMPT, max_tokens=args.tokens, speculative=spec))
                    key = f"{where} {how}"
                    tps.setdefault(key, []).append(r.stats.decode_tps() or 0.0)
                    steps = r.stats.rounds or max(1, len(r.tokens) - 1)
                    verify_ms.setdefault(key, []).append(1000 * r.stats.phase_seconds["verify"] / steps)
                    tokens[key] = list(r.tokens)
                    if r.stats.rounds:
                        mean_len[key] = r.stats.mean_accepted_length or 1.0
        med = {k: statistics.median(v) for k, v in tps.items()}
        vms = {k: statistics.median(v) for k, v in verify_ms.items()}
        print(f"{'configuration':<14} {'tok/s':>8} {'vs local plain':>15} {'ms/verify':>10} {'mean len':>9}")
        for key in tps:
            print(f"{key:<14} {med[key]:8.2f} {med[key] / med['local plain']:15.2f} {vms[key]:10.2f} "
                  f"{mean_len.get(key, 1.0):9.2f}")
        print(f"RPC overhead per plain token:  {1000 / med['split plain'] - 1000 / med['local plain']:+.2f} ms")
        print(f"RPC overhead per verify batch: {vms['split mtp'] - vms['local mtp']:+.2f} ms "
              f"(n_max {args.n_max}, one batch per round)")
        print(f"MTP speedup local: {med['local mtp'] / med['local plain']:.2f}x   "
              f"split: {med['split mtp'] / med['split plain']:.2f}x")
        same = len({tuple(v) for v in tokens.values()}) == 1
        print(f"greedy output identical in all four: {'yes' if same else 'NO'}")
        for session in sessions.values():
            session.close()
        return 0 if same else 1
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait()


def main() -> int:  # pragma: no cover - for python -m
    p = argparse.ArgumentParser()
    add_args(p)
    return run(p.parse_args())


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
