"""Write synthetic models to GGUF in the layouts users meet.

Layouts:
  combined              trunk and MTP blocks in one file
  trunk                 trunk only, no NextN blocks declared (``--no-mtp``)
  sidecar               MTP blocks only, absolute block indices, plus
                        token_embd / output_norm / output (``--mtp`` export)
  sharded               the combined file split in two (``-0000N-of-00002``)
  sidecar-relative      broken: MTP blocks numbered from 0 instead of n_trunk
  sidecar-duplicates    broken: head tensors also stored under legacy names
  sidecar-missing       broken: a required NextN tensor left out
  sidecar-other-embd    broken: made for a model with another hidden size
  sidecar-other-vocab   broken: made for a model with another vocabulary
  sidecar-other-layers  broken: made for a model with more trunk layers
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from engine import paths
from engine.synth import archs
from engine.synth.archs import TensorSpec
from engine.synth.oracle import OracleMaps, build_maps
from engine.synth.spec import SynthSpec
from engine.synth.tokenizer import Vocabulary, build_vocabulary
from engine.synth.weights import WeightFiller, effective_map

LAYOUTS = (
    "combined", "trunk", "sidecar", "sharded", "sidecar-relative", "sidecar-duplicates",
    "sidecar-missing", "sidecar-other-embd", "sidecar-other-vocab", "sidecar-other-layers",
)


def synth_dir() -> Path:
    path = paths.cache_dir() / "synth"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _write(path: Path, spec: SynthSpec, vocab: Vocabulary, tensors: Iterable[tuple[str, np.ndarray]],
           name: str, *, with_mtp: bool = True, split_max_tensors: int = 0) -> None:
    import gguf

    writer = gguf.GGUFWriter(path, spec.arch, split_max_tensors=split_max_tensors)
    writer.add_name(name)
    for key, value in archs.metadata(spec, with_mtp).items():
        full = f"{spec.arch}.{key}"
        if isinstance(value, bool):
            writer.add_bool(full, value)
        elif isinstance(value, int):
            writer.add_uint32(full, value)
        elif isinstance(value, float):
            writer.add_float32(full, value)
        else:
            writer.add_array(full, value)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.types)
    writer.add_token_merges(vocab.merges)
    writer.add_bos_token_id(vocab.bos)
    writer.add_eos_token_id(vocab.eos)
    writer.add_add_bos_token(False)
    dtype = np.float16 if spec.dims.dtype == "f16" else np.float32
    for tname, arr in tensors:
        # norms and biases stay f32, as converters write them
        writer.add_tensor(tname, arr.astype(dtype) if arr.ndim > 1 else arr.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


class SynthModel:
    """The files of one spec, generated on first use and cached by the spec's key."""

    def __init__(self, spec: SynthSpec) -> None:
        self.spec = spec
        self.dir = synth_dir() / spec.key()
        self.vocab = build_vocabulary(spec.dims.n_vocab)
        self._arrays: dict[str, np.ndarray] | None = None
        self._maps: OracleMaps | None = None

    # -- content ------------------------------------------------------------
    @property
    def maps(self) -> OracleMaps | None:
        """Effective oracle maps (from the JSON description), or None for random weights."""
        if self.spec.weights != "oracle":
            return None
        if self._maps is None:
            desc = self.description()
            o = desc["oracle"]
            self._maps = OracleMaps(f=o["f"], heads=o["heads"], reads=o["reads"], n_normal=o["n_normal"])
        return self._maps

    def _tensor_specs(self) -> list[TensorSpec]:
        d = self.spec.dims
        out = archs.global_tensors(self.spec)
        for i in range(d.n_trunk + self.spec.n_heads):
            out += archs.block_tensors(self.spec, i)
        return out

    def _build(self) -> dict[str, np.ndarray]:
        if self._arrays is None:
            maps = None
            if self.spec.weights != "random":
                maps = build_maps(self.spec, self.vocab.n_normal, self.vocab.first_word)
            filler = WeightFiller(self.spec, maps)
            self._arrays = {t.name: filler.array(t) for t in self._tensor_specs()}
            if self.spec.weights == "oracle":
                assert maps is not None
                dtype = np.float16 if self.spec.dims.dtype == "f16" else np.float32
                embd = self._arrays["token_embd.weight"].astype(dtype)
                heads = [
                    effective_map(self._arrays[f"blk.{self.spec.dims.n_trunk + i}.nextn.shared_head_head.weight"]
                                  .astype(dtype), embd, maps.n_normal)
                    for i in range(self.spec.n_heads)
                ]
                f = effective_map(self._arrays["output.weight"].astype(dtype), embd, maps.n_normal)
                self._maps = OracleMaps(f=f, heads=heads, reads=maps.reads, n_normal=maps.n_normal)
        return self._arrays

    def description(self) -> dict[str, Any]:
        path = self.dir / "model.json"
        if not path.exists():
            self._build()
            self.dir.mkdir(parents=True, exist_ok=True)
            desc: dict[str, Any] = {
                "spec": dataclasses.asdict(self.spec),
                "key": self.spec.key(),
                "n_trunk": self.spec.dims.n_trunk,
                "vocab": {"n": self.spec.dims.n_vocab, "n_normal": self.vocab.n_normal,
                          "bos": self.vocab.bos, "eos": self.vocab.eos},
            }
            if self._maps is not None:
                desc["oracle"] = dataclasses.asdict(self._maps)
            _atomic_text(path, json.dumps(desc))
        return json.loads(path.read_text())

    # -- files --------------------------------------------------------------
    def path(self, layout: str = "combined") -> Path:
        """The file of ``layout`` (the first shard for "sharded"), generating it if needed."""
        if layout not in LAYOUTS:
            raise ValueError(f"unknown layout {layout!r}; expected one of {LAYOUTS}")
        self.description()
        name = f"{layout}-00001-of-00002.gguf" if layout == "sharded" else f"{layout}.gguf"
        target = self.dir / name
        if not target.exists():
            with tempfile.TemporaryDirectory(dir=self.dir) as tmp:
                self._write_layout(layout, Path(tmp) / f"{layout}.gguf")
                for produced in sorted(Path(tmp).iterdir()):
                    os.replace(produced, self.dir / produced.name)
        return target

    def _write_layout(self, layout: str, out: Path) -> None:
        spec, d = self.spec, self.spec.dims
        arrays = self._build()
        label = f"synthetic {spec.arch} {spec.size} {spec.weights}"

        def items(select: Any) -> list[tuple[str, np.ndarray]]:
            return [(n, a) for n, a in arrays.items() if select(n)]

        def is_mtp(name: str) -> bool:
            return name.startswith("blk.") and int(name.split(".")[1]) >= d.n_trunk

        globals_ = ("token_embd.weight", "output_norm.weight", "output.weight")
        if layout == "combined":
            _write(out, spec, self.vocab, arrays.items(), label)
        elif layout == "sharded":
            half = len(arrays) // 2 + 1
            _write(out, spec, self.vocab, arrays.items(), label, split_max_tensors=half)
        elif layout == "trunk":
            _write(out, spec, self.vocab, items(lambda n: not is_mtp(n)), label + " trunk", with_mtp=False)
        elif layout == "sidecar":
            _write(out, spec, self.vocab, items(lambda n: n in globals_ or is_mtp(n)), label + " MTP")
        elif layout == "sidecar-relative":
            renamed = [(_renumber(n, -d.n_trunk), a) for n, a in items(lambda n: n in globals_ or is_mtp(n))]
            _write(out, spec, self.vocab, renamed, label + " MTP (relative indices)")
        elif layout == "sidecar-duplicates":
            base = items(lambda n: n in globals_ or is_mtp(n))
            legacy = [(n.replace(".nextn.shared_head_", ".shared_head."), a)
                      for n, a in base if ".nextn.shared_head_" in n]
            _write(out, spec, self.vocab, base + legacy, label + " MTP (duplicate names)")
        elif layout == "sidecar-missing":
            base = items(lambda n: (n in globals_ or is_mtp(n)) and not n.endswith(".nextn.hnorm.weight"))
            _write(out, spec, self.vocab, base, label + " MTP (incomplete)")
        else:  # sidecar-other-*: a sidecar generated for a different model
            other = _other_model(spec, layout)
            shutil.copyfile(SynthModel(other).path("sidecar"), out)


def _renumber(name: str, delta: int) -> str:
    if not name.startswith("blk."):
        return name
    parts = name.split(".")
    parts[1] = str(int(parts[1]) + delta)
    return ".".join(parts)


def _other_model(spec: SynthSpec, layout: str) -> SynthSpec:
    """The spec of a model that differs from ``spec`` in one way (see spec.SIZES)."""
    return spec.with_(size=f"{spec.size}-{layout.removeprefix('sidecar-')}")


def _atomic_text(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".partial")
    tmp.write_text(text)
    os.replace(tmp, path)
