#!/usr/bin/env python3
"""Does an engine patch leave a model's output without MTP untouched? Compare two builds.

Greedy-decodes one GGUF (no MTP) on two llama.cpp builds and compares token ids
and every logit row bit for bit. Each build runs in its own child process
(``LLAMA_CPP_LIB_PATH`` picks the libllama; empty means the installed engine).
The decode covers both shapes the trunk graph has: an 8-token prompt with every
row an output, and with only the last row an output (the early last-layer
crop), each followed by 32 one-token decodes.

    python scripts/trunk_identity.py MODEL.gguf --a '' --b /tmp/patched-build/bin

Used for packaging/patches/0003 (qwen4exp): see docs/engine-patches.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

PROMPT = [5, 17, 99, 3, 42, 7, 250, 11]
N_DECODE = 32


def decode(path: str, out: str) -> None:
    """The child: decode ``path`` on whatever libllama this process loaded; save tokens and logits."""
    from engine.runtime.context import Batch, Context, ContextParams
    from engine.runtime.model import Model

    m = Model(path)
    ctx = Context(m, ContextParams(n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1))
    b = Batch(64)
    logits, tokens = [], []
    for all_rows in (True, False):
        ctx.clear()
        b.clear()
        for i, t in enumerate(PROMPT):
            b.add(t, i, all_rows or i == len(PROMPT) - 1)
        ctx.decode(b)
        for r in (range(len(PROMPT)) if all_rows else [len(PROMPT) - 1]):
            logits.append(np.ctypeslib.as_array(ctx.logits(r), shape=(m.n_vocab,)).copy())
        pos, tok = len(PROMPT), int(np.argmax(logits[-1]))
        for _ in range(N_DECODE):
            tokens.append(tok)
            b.clear()
            b.add(tok, pos, True)
            ctx.decode(b)
            logits.append(np.ctypeslib.as_array(ctx.logits(0), shape=(m.n_vocab,)).copy())
            tok, pos = int(np.argmax(logits[-1])), pos + 1
    maps = Path(f"/proc/{os.getpid()}/maps")
    libs = sorted({ln.split()[-1] for ln in maps.read_text().splitlines() if "libllama" in ln}) if maps.exists() else []
    np.savez(out, logits=np.stack(logits), tokens=np.array(tokens))
    Path(out + ".json").write_text(json.dumps({"libllama": libs}))
    ctx.close()
    m.close()


def run(model: str, lib: str, out: str) -> dict[str, object]:
    env = dict(os.environ)
    env.pop("LLAMA_CPP_LIB_PATH", None)
    if lib:
        env["LLAMA_CPP_LIB_PATH"] = lib
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = root
    subprocess.run([sys.executable, __file__, "--child", model, out], env=env, check=True, cwd=root,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return json.loads(Path(out + ".json").read_text())


def main() -> int:
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        decode(sys.argv[2], sys.argv[3])
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--a", default="", help="LLAMA_CPP_LIB_PATH of build A ('' = the installed engine)")
    ap.add_argument("--b", required=True, help="LLAMA_CPP_LIB_PATH of build B")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        la, lb = run(args.model, args.a, f"{tmp}/a.npz"), run(args.model, args.b, f"{tmp}/b.npz")
        a, b = np.load(f"{tmp}/a.npz"), np.load(f"{tmp}/b.npz")
        same_tokens = bool(np.array_equal(a["tokens"], b["tokens"]))
        same_logits = bool(np.array_equal(a["logits"], b["logits"]))
        print(f"A: {la['libllama']}\nB: {lb['libllama']}")
        print(f"tokens equal: {same_tokens} ({len(a['tokens'])}), logit rows {a['logits'].shape[0]} bit-identical: "
              f"{same_logits}, max |diff| {float(np.abs(a['logits'] - b['logits']).max()):.3g}")
    return 0 if same_tokens and same_logits else 1


if __name__ == "__main__":
    raise SystemExit(main())
