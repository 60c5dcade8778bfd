"""``mtp-studio rpc-server`` (lend this machine's devices) and ``mtp-studio rpc-probe``
(what do these servers lend?)."""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
from pathlib import Path

from engine.netaddr import is_loopback
from engine.rpc.endpoints import DEFAULT_PORT


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("rpc-server", help="lend this machine's devices to another machine's MTP Studio (ggml RPC)",
                       description="Run ggml's RPC server so another machine can put part of a model here "
                                   "(`mtp-studio chat --rpc HOST:PORT …` there). No authentication, no encryption: "
                                   "it binds 127.0.0.1 unless --host says otherwise.")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: reach it through an SSH tunnel; "
                        "a LAN address exposes it to that network)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"TCP port (default {DEFAULT_PORT})")
    p.add_argument("--device", help="comma-separated ggml device names to lend (default: all; CPU when none)")
    p.add_argument("--threads", type=int, help="CPU threads for the CPU device")
    p.add_argument("--cache-dir", help="keep received weights here (by hash) so a reload sends them once; "
                                       "enables ggml's --cache")
    p.add_argument("--binary", help="a ggml-rpc-server to run instead of the one built with this engine")
    p.set_defaults(func=cmd_rpc_server)

    p = sub.add_parser("rpc-probe", help="list the devices and memory that ggml RPC servers lend")
    p.add_argument("servers", help="host:port[,host:port…]")
    p.add_argument("--timeout", type=float, default=3.0, help="seconds to wait for each server")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_rpc_probe)


def cmd_rpc_server(args: argparse.Namespace) -> int:
    from engine.rpc import server

    binary = Path(args.binary) if args.binary else server.find_binary()
    print(server.WARNING, file=sys.stderr)
    if not is_loopback(args.host):
        print(f"WARNING: listening on {args.host}, not on loopback: every machine that can reach "
              f"{args.host}:{args.port} can use this server.", file=sys.stderr)
    cmd = server.command(binary, host=args.host, port=args.port, devices=args.device, threads=args.threads,
                         cache=bool(args.cache_dir))
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    proc = subprocess.Popen(cmd, env=server.environment(args.cache_dir))
    signal.signal(signal.SIGTERM, lambda *_: proc.terminate())
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        proc.wait()
        return 0


def cmd_rpc_probe(args: argparse.Namespace) -> int:
    import dataclasses
    import json

    from engine.rpc import parse_endpoints
    from engine.rpc.probe import probe_all

    results = probe_all(parse_endpoints(args.servers), args.timeout)
    if args.json:  # one object per server and line (the app reads them as they come)
        for r in results:
            print(json.dumps(dataclasses.asdict(r)), flush=True)
    else:
        for r in results:
            if not r.ok:
                print(f"{r.endpoint}: {r.status}: {r.message}")
                continue
            print(f"{r.endpoint}: ggml RPC {r.version}, {len(r.devices)} device(s)")
            for d in r.devices:
                print(f"  RPC{d.index}[{r.endpoint}]  {d.total / 2**20:,.0f} MiB, {d.free / 2**20:,.0f} MiB free")
    return 0 if all(r.ok for r in results) else 1
