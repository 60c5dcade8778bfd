"""Facts about a GGUF file, read with the ``gguf`` package, without llama.cpp.

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

GGUF_MAGIC = b"GGUF"
_SPLIT_RE = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")


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


def _value(field_: Any) -> Any:
    try:
        return field_.contents()
    except Exception:  # a value the reader cannot decode is treated as absent
        return None


def _check_magic(path: Path) -> None:
    try:
        with path.open("rb") as f:
            magic = f.read(4)
    except FileNotFoundError:
        raise ModelFileError(f"Model file not found: {path}") from None
    except OSError as exc:
        raise ModelFileError(f"Cannot read {path}: {exc.strerror}") from exc
    if magic != GGUF_MAGIC:
        raise ModelFileError(f"{path.name} is not a GGUF file (it starts with {magic!r}, not b'GGUF').")


def read_facts(path: str | Path) -> GGUFFacts:
    """Read and validate a GGUF file's metadata.

    Raises:
        ModelFileError: missing, unreadable, not GGUF, corrupt or truncated.
    """
    from gguf import GGUFReader

    path = Path(path)
    _check_magic(path)
    try:
        reader = GGUFReader(path, "r")
    except Exception as exc:
        raise ModelFileError(f"{path.name} is not a valid GGUF file: {exc}") from exc

    fields = reader.fields

    def get(key: str, default: Any = None) -> Any:
        f = fields.get(key)
        if f is None:
            return default
        value = _value(f)
        return default if value is None else value

    arch = get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise ModelFileError(f"{path.name} has no general.architecture; it is not a model GGUF.")

    file_size = path.stat().st_size
    quant: Counter[str] = Counter()
    n_params = 0
    names: list[str] = []
    for tensor in reader.tensors:
        end = tensor.data_offset + tensor.n_bytes
        if end > file_size:
            raise ModelFileError(
                f"{path.name} is truncated: tensor {tensor.name} ends at byte {end} but the file "
                f"has {file_size} bytes. Download it again."
            )
        quant[tensor.tensor_type.name] += 1
        n_params += int(tensor.n_elements)
        names.append(tensor.name)

    block_count = int(get(f"{arch}.block_count", 0))
    nextn = int(get(f"{arch}.nextn_predict_layers", 0))
    n_embd = int(get(f"{arch}.embedding_length", 0))
    tokens_field = fields.get("tokenizer.ggml.tokens")
    if tokens_field is not None:
        digest = hashlib.sha256()
        for idx in tokens_field.data:
            digest.update(tokens_field.parts[idx].tobytes())
            digest.update(b"\0")
        vocab_size = len(tokens_field.data)
        token_hash = digest.hexdigest()
    else:
        vocab_size, token_hash = 0, ""
    template = get("tokenizer.chat_template")
    match = _SPLIT_RE.search(path.name)
    split_count = int(get("split.count", int(match.group(2)) if match else 1))

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
        n_embd_out=int(get(f"{arch}.embedding_length_out", n_embd)),
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
    )
