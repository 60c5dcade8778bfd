"""``mtp-studio models …``: search, download, list, inspect, doctor, repair, fit."""

from __future__ import annotations

import argparse
import sys
import threading
from pathlib import Path

from engine import paths


def register(sub: argparse._SubParsersAction) -> None:
    models = sub.add_parser("models", help="find, download, inspect and repair GGUF models and MTP sidecars")
    msub = models.add_subparsers(dest="models_command", metavar="ACTION", required=True)

    p = msub.add_parser("search", help="search the Hugging Face hub for GGUF repositories")
    p.add_argument("query")
    p.add_argument("--limit", type=int, default=20)
    p.set_defaults(func=cmd_search)

    p = msub.add_parser("files", help="a repository's GGUF files by quantization, and the MTP sidecar to use")
    p.add_argument("repo")
    p.set_defaults(func=cmd_files)

    p = msub.add_parser("download", help="download files (every shard; resumes; sha256-verified)")
    p.add_argument("repo")
    p.add_argument("files", nargs="+")
    p.add_argument("--dest", type=Path, default=None, help="folder (default: the app's models folder)")
    p.set_defaults(func=cmd_download)

    p = msub.add_parser("list", help="models on disk: the hub cache and your folders")
    p.add_argument("--add-folder", type=Path, help="remember another folder to scan")
    p.set_defaults(func=cmd_list)

    p = msub.add_parser("inspect", help="a GGUF's facts, read from its header")
    p.add_argument("file", type=Path)
    p.set_defaults(func=cmd_inspect)

    p = msub.add_parser("doctor", help="does this MTP sidecar (or vision projector, mmproj-*.gguf) fit this target?")
    p.add_argument("target", type=Path)
    p.add_argument("sidecar", type=Path, help="an MTP sidecar, or a vision projector (mmproj-*.gguf)")
    p.add_argument("--probe", action="store_true",
                   help="also draft a few short replies with the pair (in a child process) and report acceptance")
    p.set_defaults(func=cmd_doctor)

    p = msub.add_parser("repair", help="write a fixed copy of a broken sidecar and prove it loads")
    p.add_argument("target", type=Path)
    p.add_argument("sidecar", type=Path)
    p.add_argument("--out", type=Path)
    p.set_defaults(func=cmd_repair)

    p = msub.add_parser("fit", help="estimate memory at a context size against this machine")
    p.add_argument("file", type=Path)
    p.add_argument("--sidecar", type=Path)
    p.add_argument("--ctx", type=int, default=4096)
    p.add_argument("--no-mtp", action="store_true")
    p.add_argument("--rpc", help="also split the estimate across these ggml RPC servers (host:port,…) and "
                                 "this machine, as a load with --rpc would (docs/multi-machine.md)")
    p.add_argument("--tensor-split", help="with --rpc: one share per device, remote first, this machine last")
    p.set_defaults(func=cmd_fit)


def cmd_search(args: argparse.Namespace) -> int:
    from engine.store import hub

    for r in hub.search(args.query, args.limit, token=_token()):
        print(f"{r.repo_id:<60} {r.downloads:>10} downloads {r.likes:>6} likes")
    return 0


def cmd_files(args: argparse.Namespace) -> int:
    from engine.store import hub

    groups = hub.repo_files(args.repo, token=_token())
    for g in groups:
        kind = "vision projector" if g.is_projector else "MTP sidecar" if g.is_mtp else "model"
        shards = f", {g.shards} shards" if g.shards > 1 else ""
        print(f"{g.quant:<12} {g.size / 2**30:8.2f} GiB  {kind}{shards}: {', '.join(g.files)}")
    side = hub.suggest_sidecar(args.repo, groups)
    print(f"\nMTP sidecar: {side[0]} / {side[1]}" if side else "\nno MTP sidecar known for this repository")
    return 0


def cmd_download(args: argparse.Namespace) -> int:
    from engine.store.download import DownloadCancelled, Progress, download

    dest = args.dest or paths.data_dir() / "models" / args.repo.replace("/", "__")
    cancel = threading.Event()

    def show(p: Progress) -> None:
        pct = 100 * p.done / p.total if p.total else 0
        resumed = f" (resumed at {p.resumed_from / 2**20:.0f} MiB)" if p.resumed_from else ""
        sys.stderr.write(f"\r{p.filename}: {pct:5.1f}% of {p.total / 2**20:.0f} MiB, "
                         f"{p.bytes_per_s / 2**20:.1f} MiB/s{resumed}   ")

    try:
        for name in args.files:
            path = download(args.repo, name, dest, token=_token(), progress=show, cancel=cancel)
            sys.stderr.write("\n")
            print(path)
    except (KeyboardInterrupt, DownloadCancelled):
        print("\ncancelled; run the same command again to resume", file=sys.stderr)
        return 130
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from engine.store import library

    if args.add_folder:
        library.add_folder(args.add_folder)
    for e in library.scan():
        if e.facts is None:
            print(f"{e.path}\n    unreadable: {e.problem}")
            continue
        f = e.facts
        quant = max(f.quantization, key=lambda k: f.quantization[k]) if f.quantization else "?"
        print(f"{e.path}\n    {f.architecture}, {f.n_params / 1e9:.2f} B params, {quant}, "
              f"{f.file_size / 2**30:.2f} GiB, ctx {f.context_length}, MTP {f.nextn_layers} ({f.layout}), "
              f"chat template {'yes' if f.has_chat_template else 'no'}")
    for p in library.scan_projectors():
        if p.facts is None:
            print(f"{p.path}\n    vision projector, unreadable: {p.problem}")
            continue
        print(f"{p.path}\n    vision projector {p.facts.projector_type}, output width {p.facts.width or '?'}, "
              f"{p.facts.file_size / 2**30:.2f} GiB")
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    from engine.gguf.facts import read_facts
    from engine.store.projectors import PROJECTOR_ARCH, read_projector

    facts = read_facts(args.file)
    lines = read_projector(args.file).summary_lines() if facts.architecture == PROJECTOR_ARCH else facts.summary_lines()
    print("\n".join(lines))
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from engine.store.doctor import diagnose, diagnose_projector, is_projector_name, run_probe

    if is_projector_name(args.sidecar):
        projector = diagnose_projector(args.target, args.sidecar)
        print(projector.report())
        return 0 if projector.ok else 1
    d = diagnose(args.target, args.sidecar)
    if args.probe:
        print("probing: drafting a few short replies with the pair…", file=sys.stderr, flush=True)
        d = run_probe(d)
    print(d.report())
    return 0 if d.ok else 1


def cmd_repair(args: argparse.Namespace) -> int:
    from engine.store.repair import prove, repair

    out = repair(args.target, args.sidecar, args.out)
    print(f"wrote {out}")
    print(f"proof: {prove(args.target, out)}")
    return 0


def cmd_fit(args: argparse.Namespace) -> int:
    from engine.store.fit import estimate

    est = estimate(args.file, n_ctx=args.ctx, sidecar=args.sidecar, mtp=not args.no_mtp)
    print(f"{args.file.name} at n_ctx {args.ctx}:")
    print("\n".join("  " + line for line in est.lines()))
    if getattr(args, "rpc", None):
        return _fit_split(args)
    return 0


def _fit_split(args: argparse.Namespace) -> int:
    from engine.rpc import parse_endpoints
    from engine.rpc.probe import probe_all
    from engine.store.fit import available_memory
    from engine.store.fit_split import split_estimate

    devices: list[tuple[str, int | None]] = []
    for found in probe_all(parse_endpoints(args.rpc)):
        if not found.ok:
            print(f"error: {found.message}", file=sys.stderr)
            return 1
        devices += [(f"RPC{d.index}[{found.endpoint}]", d.free) for d in found.devices]
    devices.append(("this machine (RAM)", available_memory()))
    split = [float(x) for x in args.tensor_split.split(",")] if args.tensor_split else None
    _, shares = split_estimate(args.file, devices, n_ctx=args.ctx, sidecar=args.sidecar, mtp=not args.no_mtp,
                               tensor_split=split)
    print("split across devices (remote first, this machine last; the MTP head stays here):")
    print("\n".join("  " + share.line() for share in shares))
    return 0 if all(share.verdict != "won't fit" for share in shares) else 1


def _token() -> str | None:
    from engine.store.credentials import get_token

    return get_token()
