"""Two engine builds side by side: what a patch to llama.cpp changes in the
decodes that keep recurrent snapshots (``n_rs_seq``).

A process can load one libllama, so each build runs in its own child process
(``LLAMA_CPP_LIB_PATH`` names the folder holding its libllama.so), the builds
alternate A, B, B, A, … and the ratio is taken within each pair. The child
times, on a hybrid (delta-net) target with ``n_rs_seq`` snapshots:

- ``decode``: one-token decodes, the plain-decoding step of a context that
  keeps snapshots for speculation (llama-server keeps them for every slot);
- ``verify``: (1 + n_max)-row decodes followed by a partial rollback through
  ``seq_rm``, the MTP verify step;
- ``plain``: one-token decodes on a context without snapshots, for scale;
- ``mtp_gen`` / ``plain_gen``: milliseconds per generated token of a whole
  greedy generation through the engine (``Session``), with MTP at ``n_max``
  (rollback as the engine chooses it: ``n_rs_seq`` snapshots, or state
  checkpoints where the build gives the architecture none) and without.

Run: ``python -m engine.bench.snapshots MODEL.gguf --lib A_DIR --lib B_DIR``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

PHASES = ("decode", "verify", "plain", "mtp_gen", "plain_gen")
MICRO = ("decode", "verify", "plain")


def _generation(path: str, n_max: int, steps: int, threads: int) -> dict[str, float]:
    from engine.generation.generator import GenerateRequest, generate
    from engine.generation.session import LoadOptions, Session
    from engine.speculative.settings import SpeculativeSettings

    session = Session(LoadOptions(path=path, n_ctx=2048, n_threads=threads))
    out: dict[str, float] = {}
    try:
        for phase, spec in (("mtp_gen", SpeculativeSettings("mtp", n_max)), ("plain_gen", SpeculativeSettings())):
            generate(session, GenerateRequest(prompt=" the river model light", max_tokens=8, speculative=spec))
            res = generate(session, GenerateRequest(prompt=" the river model light", max_tokens=steps,
                                                    speculative=spec))
            out[phase] = 1000 / (res.stats.decode_tps() or float("inf"))
        out["rollback"] = session.rollback_strategy  # type: ignore[assignment]
    finally:
        session.close()
    return out


def _child(path: str, n_rs_seq: int, n_max: int, steps: int, threads: int, phases: tuple[str, ...]) -> dict:
    """Median milliseconds per step of each phase, in this process's engine build."""
    from engine.runtime import Batch, Context, ContextParams, Model

    out: dict = _generation(path, n_max, 2 * steps, threads) if {"mtp_gen", "plain_gen"} & set(phases) else {}
    model = Model(path)
    prompt = model.tokenize(" the river model light " * 8)
    try:
        for phase in (p for p in MICRO if p in phases):
            keep = 0 if phase == "plain" else n_rs_seq
            ctx = Context(model, ContextParams(n_ctx=2048, n_batch=512, n_ubatch=512, n_threads=threads,
                                               n_rs_seq=keep, n_outputs_max=n_max + 1))
            if phase == "decode":  # llama.cpp logs the graph sizes it reserved: prompt-batch/one-token nodes
                from engine.runtime import native

                sizes = [x for x in native.recent_log(400, "nodes =") if "graph" in x]
                out["graph_nodes"] = sizes[-1].split("nodes =")[1].split(",")[0].strip() if sizes else "?"
            if keep and ctx.n_rs_seq != keep:
                raise SystemExit(f"error: {model.description()} does not keep n_rs_seq snapshots "
                                 f"(got {ctx.n_rs_seq}); use a hybrid model such as a qwen35 synthetic one.")
            batch = Batch(512)
            for i, tok in enumerate(prompt):
                batch.add(tok, i, i == len(prompt) - 1)
            ctx.decode(batch)
            pos, times = len(prompt), []
            rows = n_max + 1 if phase == "verify" else 1
            for step in range(steps):
                batch.clear()
                for j in range(rows):
                    batch.add(prompt[(step + j) % len(prompt)], pos + j, True)
                t0 = time.perf_counter()
                ctx.decode(batch)
                if phase == "verify":  # accept half the drafts: roll the rest back
                    kept = 1 + n_max // 2
                    if not ctx.seq_rm(pos + kept, -1):
                        raise SystemExit(f"error: rollback to {pos + kept} refused")
                    pos += kept
                else:
                    pos += 1
                times.append(time.perf_counter() - t0)
            out[phase] = 1000 * statistics.median(times[2:])
            ctx.close()
    finally:
        model.close()
    return out


def _run_child(lib: Path, args: argparse.Namespace) -> dict[str, float]:
    env = dict(os.environ, LLAMA_CPP_LIB_PATH=str(lib))
    cmd = [sys.executable, "-m", "engine.bench.snapshots", args.model, "--child", "--n-rs-seq", str(args.n_rs_seq),
           "--n-max", str(args.n_max), "--steps", str(args.steps), "--threads", str(args.threads),
           "--phases", ",".join(args.phases)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"error: the run with {lib} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model")
    p.add_argument("--lib", action="append", type=Path, default=[],
                   help="folder with a libllama.so (twice: A then B)")
    p.add_argument("--n-rs-seq", type=int, default=8)
    p.add_argument("--n-max", type=int, default=3, help="drafts per verify (verify rows = 1 + n_max)")
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--repeats", type=int, default=4)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--phases", default=",".join(PHASES),
                   help=f"comma-separated, of {', '.join(PHASES)} (micro phases need n_rs_seq support)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.phases = tuple(x for x in args.phases.split(",") if x)
    if args.child:
        print(json.dumps(_child(args.model, args.n_rs_seq, args.n_max, args.steps, args.threads, args.phases)))
        return 0
    if len(args.lib) != 2:
        p.error("give two --lib folders (A, B)")
    for lib in args.lib:
        if not (lib / "libllama.so").exists():
            p.error(f"{lib} has no libllama.so")
    a, b = args.lib
    print(f"# snapshot slots: A={a} B={b}; {Path(args.model).name}, n_rs_seq {args.n_rs_seq}, "
          f"verify {1 + args.n_max} rows, {args.steps} steps, {args.threads} thread(s); ms per step, medians")
    phases = [ph for ph in PHASES if ph in args.phases]
    ratios: dict[str, list[float]] = {ph: [] for ph in phases}
    ms: dict[str, dict[str, list[float]]] = {"A": {ph: [] for ph in phases}, "B": {ph: [] for ph in phases}}
    for rep in range(args.repeats):
        order = [("A", a), ("B", b)] if rep % 2 == 0 else [("B", b), ("A", a)]
        got = {name: _run_child(lib, args) for name, lib in order}
        if rep == 0 and "graph_nodes" in got["A"]:
            print(f"graph nodes with n_rs_seq {args.n_rs_seq} (prompt batch/one token): "
                  f"A {got['A']['graph_nodes']}  B {got['B']['graph_nodes']}")
        for ph in phases:
            ms["A"][ph].append(got["A"][ph])
            ms["B"][ph].append(got["B"][ph])
            ratios[ph].append(got["A"][ph] / got["B"][ph])
        print(f"repeat {rep}: " + "  ".join(f"{ph} A {got['A'][ph]:.2f} B {got['B'][ph]:.2f}" for ph in phases)
              + "".join(f"  rollback {k} {got[k]['rollback']}" for k in ("A", "B") if "rollback" in got[k]),
              flush=True)
    print(f"{'phase':<9} {'A ms':>8} {'B ms':>8} {'A/B':>7}  per pair")
    for ph in phases:
        print(f"{ph:<9} {statistics.median(ms['A'][ph]):8.2f} {statistics.median(ms['B'][ph]):8.2f} "
              f"{statistics.median(ratios[ph]):6.3f}x  " + " ".join(f"{x:.3f}" for x in ratios[ph]))
    # Each child also decodes without snapshots ("plain"): a phase's cost over plain in the same process
    # is robust to the machine speeding up or slowing down between children.
    if "plain" not in phases:
        return 0
    print("cost over plain decoding in the same process (medians): " + "; ".join(
        f"{ph} A {statistics.median(x / y for x, y in zip(ms['A'][ph], ms['A']['plain'], strict=True)):.3f} "
        f"B {statistics.median(x / y for x, y in zip(ms['B'][ph], ms['B']['plain'], strict=True)):.3f}"
        for ph in ("decode", "verify") if ph in phases))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
