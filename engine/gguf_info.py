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
from typing import Any

from engine.errors import ModelFileError
from engine.gguf_header import Header, StringArraySummary, read_header

_SPLIT_RE = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")

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

    Raises:
        ModelFileError: missing, unreadable, not GGUF, corrupt or truncated.
    """
    from gguf.constants import GGMLQuantizationType

    path = Path(path)
    header = read_header(path)
    meta = header.metadata

    def get(key: str, default: Any = None) -> Any:
        value = meta.get(key)
        return default if value is None else value

    arch = get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise ModelFileError(f"{path.name} has no general.architecture; it is not a model GGUF.")

    match = _SPLIT_RE.search(path.name)
    split_count = int(get("split.count", int(match.group(2)) if match else 1))
    quant: Counter[str] = Counter()
    n_params = 0
    names: list[str] = []
    shapes: list[tuple[int, ...]] = []
    file_size = 0
    for shard in _headers(path, header, split_count):
        file_size += shard.file_size
        for tensor in shard.tensors:
            try:
                quant[GGMLQuantizationType(tensor.ggml_type).name] += 1
            except ValueError:
                quant[f"type{tensor.ggml_type}"] += 1
            n_params += tensor.n_elements
            names.append(tensor.name)
            shapes.append(tuple(tensor.shape))

    block_count = int(get(f"{arch}.block_count", 0))
    nextn = int(get(f"{arch}.nextn_predict_layers", 0))
    n_embd = int(get(f"{arch}.embedding_length", 0))
    n_embd_out = int(get(f"{arch}.embedding_length_out", n_embd))
    if arch in _HYPER_CONNECTION_OUT and get(f"{arch}.hyper_connection.count"):
        n_embd_out = int(get(f"{arch}.hyper_connection.count")) * n_embd
    tokens = meta.get("tokenizer.ggml.tokens")
    if isinstance(tokens, StringArraySummary):
        vocab_size, token_hash = tokens.count, tokens.sha256
    elif isinstance(tokens, list):
        digest = hashlib.sha256()
        for tok in tokens:
            digest.update(tok.encode("utf-8"))
            digest.update(b"\0")
        vocab_size, token_hash = len(tokens), digest.hexdigest()
    else:
        vocab_size, token_hash = 0, ""
    template = get("tokenizer.chat_template")

    name_set = set(names)
    if nextn <= 0:
        layout = "plain"
    else:
        trunk = block_count - nextn
        has_trunk = "blk.0.attn_norm.weight" in name_set
        has_mtp = f"blk.{trunk}.nextn.eh_proj.weight" in name_set
        layout = {(True, True): "combined", (True, False): "trunk-only",
                  (False, True): "mtp-only"}.get((has_trunk, has_mtp), "mtp-only")

    bos = get("tokenizer.ggml.bos_token_id")
    eos = get("tokenizer.ggml.eos_token_id")
    return GGUFFacts(
        path=path,
        architecture=arch,
        name=str(get("general.name", "")),
        file_size=file_size,
        n_params=n_params,
        block_count=block_count,
        nextn_layers=nextn,
        n_embd=n_embd,
        n_embd_out=n_embd_out,
        context_length=int(get(f"{arch}.context_length", 0)),
        vocab_size=vocab_size,
        has_chat_template=isinstance(template, str) and bool(template.strip()),
        chat_template=template if isinstance(template, str) else None,
        quantization=dict(quant),
        tensor_count=len(names),
        split_count=split_count,
        layout=layout,
        token_list_sha256=token_hash,
        bos_token_id=int(bos) if bos is not None else None,
        eos_token_id=int(eos) if eos is not None else None,
        tensor_names=tuple(names),
        tensor_shapes=tuple(shapes),
    )
