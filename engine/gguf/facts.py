"""Facts about a GGUF file, read from its header, without llama.cpp.

llama.cpp aborts the whole process on many malformed files, so every file is
checked here first: magic, parseable metadata, an architecture, tensor data
inside the file. Only a file that passes reaches a native load (and only in
the worker process).
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from engine.errors import ModelFileError
from engine.gguf.header import Header, StringArraySummary, read_header

_SPLIT_RE = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")

# Bounds on values read from a header: far above any real model, low enough that
# nothing sized by them (a list of blocks, of shard paths) can exhaust memory.
MAX_BLOCKS = 4096
MAX_SPLITS = 99_999
MAX_WIDTH = 1 << 24
MAX_U32 = 2**32 - 1

# Architectures whose hidden state (what the trunk hands the MTP head, llama.cpp's
# n_embd_out) is hyper_connection.count streams of n_embd: their loaders set
# n_embd_out_impl = hc_mult * n_embd (vendor src/models/deepseek4.cpp, qwen4exp.cpp).
_HYPER_CONNECTION_OUT = frozenset({"deepseek4", "qwen4exp"})


@dataclass(frozen=True)
class GGUFFacts:
    """What the app needs to know about a model file before loading it."""

    path: Path
    architecture: str
    name: str
    file_size: int
    n_params: int
    block_count: int
    nextn_layers: int
    n_embd: int
    n_embd_out: int
    context_length: int
    vocab_size: int
    has_chat_template: bool
    chat_template: str | None
    quantization: dict[str, int]  # tensor type name -> number of tensors
    tensor_count: int
    split_count: int
    layout: str  # "plain" | "combined" | "trunk-only" | "mtp-only"
    token_list_sha256: str
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    tensor_names: tuple[str, ...] = field(default=(), repr=False)
    tensor_shapes: tuple[tuple[int, ...], ...] = field(default=(), repr=False)  # ggml order, as tensor_names

    @property
    def trunk_layers(self) -> int:
        return self.block_count - self.nextn_layers

    @property
    def has_mtp(self) -> bool:
        return self.nextn_layers > 0 and self.layout in ("combined", "mtp-only")

    def summary_lines(self) -> list[str]:
        """Human-readable lines for ``mtp-studio info`` and the GUI."""
        quant = ", ".join(f"{k}×{v}" for k, v in sorted(self.quantization.items(), key=lambda kv: -kv[1]))
        return [
            f"file          {self.path}",
            f"architecture  {self.architecture}" + (f"  ({self.name})" if self.name else ""),
            f"size          {self.file_size / 2**20:.1f} MiB, {self.n_params / 1e6:.1f} M parameters"
            + (f" (shard 1 of {self.split_count})" if self.split_count > 1 else ""),
            f"layers        {self.block_count} blocks: {self.trunk_layers} trunk + "
            f"{self.nextn_layers} MTP/NextN",
            f"MTP layout    {self.layout}",
            f"embedding     {self.n_embd}" + (f" (out {self.n_embd_out})" if self.n_embd_out != self.n_embd else ""),
            f"context       {self.context_length} tokens (trained)",
            f"vocabulary    {self.vocab_size} tokens, list sha256 {self.token_list_sha256[:12]}",
            f"quantization  {quant}",
            f"chat template {'present' if self.has_chat_template else 'absent (plain completion)'}",
        ]


def windowed(n_swa: int, arch: str | None, n_layer: int) -> int:
    """The window llama.cpp attends through, 0 where it windows no layer though ``llama_model_n_swa`` reports
    one: EXAONE 4 reads its GGUF's window whatever its size but windows only the 64-layer 32B
    (models/exaone4.cpp). Taken at its word, a 1.2B's cache looked windowed: sequences in one pool did not
    share prompt cells, states longer than the window were not cut back from host memory, and a copy of
    the "window" was taken at every prompt's end. Read here, below both its users: the loaded model
    (engine/runtime/model.py) and the memory estimate from the header (engine/store/fit.py)."""
    if arch == "exaone4" and n_layer != 64:
        return 0
    return n_swa


def shard_paths(path: Path, split_count: int) -> list[Path]:
    """All shards of a split model, given its first shard (``-00001-of-0000N.gguf``)."""
    match = _SPLIT_RE.search(path.name)
    if split_count <= 1 or not match:
        return [path]
    stem = path.name[: match.start()]
    return [path.with_name(f"{stem}-{i:05d}-of-{split_count:05d}.gguf") for i in range(1, split_count + 1)]


def _headers(path: Path, first: Header, split_count: int) -> list[Header]:
    out = [first]
    for other in shard_paths(path, split_count)[1:]:
        if not other.exists():
            raise ModelFileError(
                f"{path.name} is shard 1 of {split_count}, but {other.name} is missing. "
                "Download every shard into the same folder."
            )
        out.append(read_header(other))
    return out


def read_facts(path: str | Path) -> GGUFFacts:
    """Read and validate a GGUF file's metadata (every shard of a split model).

    Every value is read through ``Header.get`` / ``Header.integer`` (typed, bounded):
    a malformed value is this function's ModelFileError, never a ValueError from
    ``int()`` deep in a caller, and no count taken from the file is trusted
    before it is bounded.

    Raises:
        ModelFileError: missing, unreadable, not GGUF, corrupt, truncated, or
            holding a value of the wrong type or out of range.
    """
    path = Path(path)
    header = read_header(path)
    arch = header.get("general.architecture", "string")
    if not arch:
        raise ModelFileError(f"{path.name} has no general.architecture; it is not a model GGUF.")
    split_count = _split_count(header, path)
    block_count, nextn = _layers(header, arch)
    n_embd, n_embd_out = _widths(header, arch)
    vocab_size, token_hash = _vocabulary(header)
    template = header.get("tokenizer.chat_template", "string")
    shards = _headers(path, header, split_count)  # after the metadata: a bad value is named before shards are read
    names = tuple(t.name for shard in shards for t in shard.tensors)
    return GGUFFacts(
        path=path,
        architecture=arch,
        name=header.get("general.name", "string", ""),
        file_size=sum(shard.file_size for shard in shards),
        n_params=sum(t.n_elements for shard in shards for t in shard.tensors),
        block_count=block_count,
        nextn_layers=nextn,
        n_embd=n_embd,
        n_embd_out=n_embd_out,
        context_length=header.integer(f"{arch}.context_length", 0, high=MAX_U32),
        vocab_size=vocab_size,
        has_chat_template=bool(template and template.strip()),
        chat_template=template,
        quantization=_quantization(shards),
        tensor_count=len(names),
        split_count=split_count,
        layout=_layout(set(names), block_count, nextn),
        token_list_sha256=token_hash,
        bos_token_id=header.integer("tokenizer.ggml.bos_token_id", high=MAX_U32),
        eos_token_id=header.integer("tokenizer.ggml.eos_token_id", high=MAX_U32),
        tensor_names=names,
        tensor_shapes=tuple(tuple(t.shape) for shard in shards for t in shard.tensors),
    )


def _split_count(header: Header, path: Path) -> int:
    """How many shards: ``split.count``, else the file name's ``-0000N-of-0000M``; at most
    99999 (shard names have five digits), so that no list of shard paths is built from 10^9."""
    match = _SPLIT_RE.search(path.name)
    return header.integer("split.count", int(match.group(2)) if match else 1, high=MAX_SPLITS)


def _layers(header: Header, arch: str) -> tuple[int, int]:
    """(block_count, nextn_predict_layers), bounded: the doctor, the fit estimate and the
    sidecar checks loop over blocks, and llama.cpp asserts on more NextN layers than blocks."""
    block_count = header.integer(f"{arch}.block_count", 0, high=MAX_BLOCKS)
    nextn = header.integer(f"{arch}.nextn_predict_layers", 0, high=MAX_BLOCKS)
    if nextn > block_count:
        raise ModelFileError(
            f"{header.name} is malformed: its {arch}.nextn_predict_layers ({nextn}) is more than its "
            f"{arch}.block_count ({block_count}); the NextN layers are the last of the blocks. "
            "llama.cpp would abort on it. Use another export."
        )
    return block_count, nextn


def _widths(header: Header, arch: str) -> tuple[int, int]:
    """(n_embd, n_embd_out): the hidden width, and what the trunk hands the MTP head."""
    n_embd = header.integer(f"{arch}.embedding_length", 0, high=MAX_WIDTH)
    n_embd_out = header.integer(f"{arch}.embedding_length_out", n_embd, high=MAX_WIDTH)
    streams = header.integer(f"{arch}.hyper_connection.count", 0, high=MAX_BLOCKS)
    if arch in _HYPER_CONNECTION_OUT and streams:
        n_embd_out = streams * n_embd
    return n_embd, n_embd_out


def _vocabulary(header: Header) -> tuple[int, str]:
    """(vocabulary size, sha256 of the token list): a sidecar must share the target's tokens."""
    tokens = header.get("tokenizer.ggml.tokens", "string array")
    if isinstance(tokens, StringArraySummary):
        return tokens.count, tokens.sha256
    if tokens is None:
        return 0, ""
    digest = hashlib.sha256()
    for tok in tokens:
        digest.update(tok.encode("utf-8"))
        digest.update(b"\0")
    return len(tokens), digest.hexdigest()


def _quantization(shards: list[Header]) -> dict[str, int]:
    """Tensor type name -> number of tensors, over every shard."""
    from gguf.constants import GGMLQuantizationType

    by_id = Counter(tensor.ggml_type for shard in shards for tensor in shard.tensors)
    quant: Counter[str] = Counter()
    for type_id, n in by_id.items():
        try:
            quant[GGMLQuantizationType(type_id).name] += n
        except ValueError:
            quant[f"type{type_id}"] += n
    return dict(quant)


def _layout(names: set[str], block_count: int, nextn: int) -> str:
    """Which blocks the file holds: plain (no MTP), combined, trunk-only or mtp-only."""
    if nextn <= 0:
        return "plain"
    # qwen4exp has no attn_norm: hyper-connection mixers stand in for every layer norm
    has_trunk = "blk.0.attn_norm.weight" in names or "blk.0.hc_attn_norm.weight" in names
    has_mtp = f"blk.{block_count - nextn}.nextn.eh_proj.weight" in names
    return {(True, True): "combined", (True, False): "trunk-only"}.get((has_trunk, has_mtp), "mtp-only")
