"""How much of real text a draft-vocabulary cut keeps (``--draft-vocab N``: the MTP head drafts only
among token ids below N; docs/mtp.md, "A draft vocabulary").

The cut rests on one assumption: that a vocabulary numbers its frequent tokens first. This measures it
with real tokenizers on real text instead of assuming it:

    .venv/bin/python scripts/draft_vocab_coverage.py                       # the built-in model's vocabulary
    .venv/bin/python scripts/draft_vocab_coverage.py --gguf MODEL.gguf     # any GGUF's (llama.cpp's tokenizer)
    .venv/bin/python scripts/draft_vocab_coverage.py --tiktoken qwen.tiktoken   # Qwen's byte-pair ranks

(``qwen.tiktoken``, Qwen's 151,643 byte-pair ranks, ships in the ``dashscope`` wheel on PyPI as
``dashscope/resources/qwen.tiktoken``; reading it needs ``tiktoken``.) The texts: this project's docs,
a fixed sample of Python's standard library, the licences in /usr/share/common-licenses where they exist,
and any ``--text`` files.

Prints, per text, the share of its tokens below each cut, and what a cut at 32,768 and at 65,536 keeps of
a round's tokens for a head that is always right wherever it may draft (a round of depth n yields the
leading drafts below the cut plus one token from the target): the ceiling of what the cut costs in
acceptance, before any speed it buys.
"""

from __future__ import annotations

import argparse
import base64
import random
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CUTS = (16_384, 32_768, 65_536)
ROUND_CUTS = (32_768, 65_536)
DEPTHS = (1, 2, 3, 4)
LIMIT = 400_000  # characters of each text
# Qwen's pre-tokenizer pattern (the one its tiktoken files are made for)
QWEN_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
                r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")


def _read(paths: list[Path], limit: int = LIMIT) -> str:
    parts: list[str] = []
    size = 0
    for path in paths:
        try:
            part = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        parts.append(part)
        size += len(part)
        if size > limit:
            break
    return "\n".join(parts)[:limit]


def texts(extra: list[Path]) -> dict[str, str]:
    stdlib = sorted(Path(sys.base_prefix, "lib", f"python{sys.version_info[0]}.{sys.version_info[1]}").rglob("*.py"))
    random.Random(1).shuffle(stdlib)
    found = {
        "this project's docs": _read(sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]),
        "Python standard library": _read(stdlib),
        "licences (legal English)": _read(sorted(Path("/usr/share/common-licenses").glob("*"))),
    }
    if extra:  # files, or folders of them
        files = [f for path in extra for f in ([path] if path.is_file() else sorted(path.rglob("*")))]
        found["--text files"] = _read([f for f in files if f.is_file()])
    return {name: text for name, text in found.items() if text}


def tokens_per_round(ids: list[int], n: int, cut: int) -> float:
    """Tokens a round of depth ``n`` yields over ``ids`` for a head that is right wherever it may draft."""
    tokens = rounds = i = 0
    while i + n < len(ids):
        k = 0
        while k < n and ids[i + k] < cut:
            k += 1
        tokens += k + 1
        rounds += 1
        i += k + 1
    return tokens / rounds if rounds else float(n + 1)


def report(title: str, n_vocab: int, tokenize: Callable[[str], list[int]], corpus: dict[str, str]) -> None:
    print(f"{title}: {n_vocab:,} tokens")
    kept_head = " | ".join(f"cut {c:,}, n={DEPTHS[0]}..{DEPTHS[-1]}" for c in ROUND_CUTS)
    cuts = " ".join(f"<{c:>7,}" for c in CUTS)
    print(f"  {'text':26} {'tokens':>7}  {cuts}   a round's tokens kept: {kept_head}")
    for name, text in corpus.items():
        ids = tokenize(text)
        shares = " ".join(f"{sum(i < c for i in ids) / len(ids):8.3f}" for c in CUTS)
        kept = " | ".join(" ".join(f"{tokens_per_round(ids, n, c) / (n + 1):.3f}" for n in DEPTHS) for c in ROUND_CUTS)
        print(f"  {name:26} {len(ids):>7}  {shares}   {kept}")


def tiktoken_tokenizer(path: Path) -> tuple[int, Callable[[str], list[int]]]:
    try:
        import tiktoken
    except ImportError:
        raise SystemExit("reading a tiktoken file needs tiktoken: pip install tiktoken") from None
    ranks = {}
    for line in path.read_bytes().splitlines():
        if line.strip():
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    encoding = tiktoken.Encoding(path.stem, pat_str=QWEN_PATTERN, mergeable_ranks=ranks, special_tokens={})
    return len(ranks), encoding.encode_ordinary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", type=Path, action="append", default=[], help="a GGUF whose vocabulary to measure")
    parser.add_argument("--tiktoken", type=Path, action="append", default=[],
                        help="a tiktoken rank file (Qwen's pre-tokenizer pattern)")
    parser.add_argument("--text", type=Path, action="append", default=[], help="more text to measure on")
    args = parser.parse_args()
    corpus = texts(args.text)
    if not args.gguf and not args.tiktoken:
        from engine.default_model import default_model_path

        args.gguf = [default_model_path()]
    for path in args.gguf:
        from engine.runtime.model import Model

        with Model(path) as model:  # freed before the next one loads
            report(path.name, model.n_vocab,
                   lambda text, m=model: m.tokenize(text, add_special=False, parse_special=False), corpus)
    for path in args.tiktoken:
        report(path.name, *tiktoken_tokenizer(path), corpus)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
