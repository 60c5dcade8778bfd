"""Write synthetic models to GGUF in the layouts users meet.

Layouts:
  combined              trunk and MTP blocks in one file
  trunk                 trunk only, no NextN blocks declared (``--no-mtp``)
  sidecar               MTP blocks only, absolute block indices, plus
                        token_embd / output_norm / output (``--mtp`` export)
  sharded               the combined file split in two (``-0000N-of-00002``)
  sidecar-relative      broken: MTP blocks numbered from 0 instead of n_trunk
  sidecar-duplicates    broken: head tensors also stored under legacy names
                        (qwen4exp: the head's mixer also stored as output_hc_*)
  sidecar-missing       broken: a required NextN tensor left out
  sidecar-other-embd    broken: made for a model with another hidden size
  sidecar-other-vocab   broken: made for a model with another vocabulary
  sidecar-other-layers  broken: made for a model with more trunk layers
  sidecar-exact-duplicates  broken: one NextN tensor stored twice under the same name
  sidecar-renumbered    broken: metadata counts only the MTP blocks (block_count ==
                        nextn_predict_layers), blocks at blk.0
  sidecar-offset        broken: MTP blocks at blk.<n_trunk + 2>, metadata correct
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from engine import paths
from engine.synth import archs, derived, native_quant, quant
from engine.synth.archs import TensorSpec
from engine.synth.kv import add_arch_keys, add_vocabulary
from engine.synth.oracle import OracleMaps, build_maps
from engine.synth.spec import SynthSpec
from engine.synth.tokenizer import Vocabulary, build_vocabulary
from engine.synth.weights import WeightFiller, effective_map

LAYOUTS = (
    "combined", "trunk", "sidecar", "sharded", "sidecar-relative", "sidecar-duplicates",
    "sidecar-missing", "sidecar-other-embd", "sidecar-other-vocab", "sidecar-other-layers",
    "sidecar-exact-duplicates", "sidecar-renumbered", "sidecar-offset",
)


def synth_dir() -> Path:
    path = paths.cache_dir() / "synth"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _write(path: Path, spec: SynthSpec, vocab: Vocabulary, tensors: Iterable[tuple[str, np.ndarray]],
           name: str, keys: dict[str, Any], *, split_max_tensors: int = 0,
           keep_f32: frozenset[str] = frozenset(), stored: dict[int, tuple[np.ndarray, Any]] | None = None) -> None:
    """Write one file. ``stored`` (natively quantized sizes): the data and type llama.cpp's quantizer
    stored for each array, keyed by ``id(array)`` so renamed copies (sidecar layouts) find theirs."""
    import gguf

    writer = gguf.GGUFWriter(path, spec.arch, split_max_tensors=split_max_tensors)
    writer.add_name(name)
    add_arch_keys(writer, spec.arch, keys)
    add_vocabulary(writer, vocab)
    for tname, arr in tensors:
        if stored is not None:
            data, raw = stored[id(arr)]
            writer.add_tensor(tname, data, raw_dtype=raw)
            continue
        # norms and biases stay f32, as converters write them
        wide = arr.ndim > 1 and tname not in keep_f32
        data, raw = quant.encode(arr, quant.written_as(spec.dims.dtype)) if wide else (arr.astype(np.float32), None)
        writer.add_tensor(tname, data, raw_dtype=raw)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


class SynthModel:
    """The files of one spec, generated on first use and cached by the spec's key."""

    def __init__(self, spec: SynthSpec) -> None:
        self.spec = spec
        self.vocab = build_vocabulary(spec.dims.n_vocab)
        self._arrays: dict[str, np.ndarray] | None = None
        self._maps: OracleMaps | None = None
        self._specs: list[TensorSpec] | None = None
        self._dir: Path | None = None
        self._native: dict[str, tuple[np.ndarray, Any]] | None = None

    @property
    def dir(self) -> Path:
        """The cache folder. A derived architecture's name also hashes the tensor
        list llama.cpp asked for, so an engine that wants other tensors gets new files."""
        if self._dir is None:
            key = self.spec.key()
            if self.spec.derived:
                listing = json.dumps([(t.name, t.shape, t.role) for t in self._tensor_specs()])
                key += "-t" + hashlib.sha256(listing.encode()).hexdigest()[:8]
            self._dir = synth_dir() / key
        return self._dir

    def metadata(self, with_mtp: bool = True) -> dict[str, Any]:
        """Architecture keys of the file (``with_mtp=False``: a trunk-only export)."""
        if self.spec.derived:
            return derived.metadata(self.spec, with_mtp)
        return archs.metadata(self.spec, with_mtp)

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
        if self._specs is None:
            if self.spec.derived:
                self._specs = derived.tensor_specs(self.spec)
            else:
                d = self.spec.dims
                self._specs = archs.global_tensors(self.spec)
                for i in range(d.n_trunk + self.spec.n_heads):
                    self._specs += archs.block_tensors(self.spec, i)
        return self._specs

    def _keep_f32(self) -> frozenset[str]:
        """Tensors that stay f32 in f16 sizes: the recurrent convolution, whose
        CPU op asserts f32 (ggml ``ssm_conv``), and for derived architectures
        anything but plain matrices plus the hyper-connection parameters."""
        if not self.spec.derived:
            return frozenset(t.name for t in self._tensor_specs() if "ssm_conv1d" in t.name)
        wide = ("matrix", "embed", "output", "head_out", "eh_proj_mix")
        return frozenset(t.name for t in self._tensor_specs()
                         if t.role not in wide or re.search(r"ssm_|hc_|_ape|conv", t.name))

    def _build(self) -> dict[str, np.ndarray]:
        if self._arrays is None:
            maps = None
            if self.spec.weights != "random":
                maps = build_maps(self.spec, self.vocab.n_active, self.vocab.first_word)
            filler = WeightFiller(self.spec, maps)
            self._arrays = {t.name: filler.array(t) for t in self._tensor_specs()}
            if self.spec.weights == "oracle":
                assert maps is not None
                embd = self._stored("token_embd.weight")
                heads = [
                    effective_map(self._stored(f"blk.{self.spec.dims.n_trunk + i}.nextn.shared_head_head.weight"),
                                  embd, maps.n_normal)
                    for i in range(self.spec.n_heads)
                ]
                f = effective_map(self._stored("output.weight"), embd, maps.n_normal)
                self._maps = OracleMaps(f=f, heads=heads, reads=maps.reads, n_normal=maps.n_normal)
        return self._arrays

    @property
    def native(self) -> bool:
        """Quantized by llama.cpp's own quantizer (K-quants), not by the Python writer."""
        return self.spec.dims.dtype in quant.NATIVE_TYPES

    def _stored(self, name: str) -> np.ndarray:
        """What the file holds for a matrix, as float32 (oracle maps are recomputed from it)."""
        if not self.native:
            assert self._arrays is not None
            return quant.stored(self._arrays[name], self.spec.dims.dtype)
        from gguf import GGMLQuantizationType, quants

        data, raw = self._native_tensors()[name]
        if raw is None:
            return data.astype(np.float32)
        return quants.dequantize(data, GGMLQuantizationType(raw)).astype(np.float32)

    def _native_tensors(self) -> dict[str, tuple[np.ndarray, Any]]:
        """Every tensor of the natively quantized combined file: name -> (data, raw type or None for floats)."""
        if self._native is None:
            target = self.dir / "combined.gguf"
            if not target.exists():
                self.dir.mkdir(parents=True, exist_ok=True)
                with tempfile.TemporaryDirectory(dir=self.dir) as tmp:
                    self._quantize_natively(Path(tmp) / "combined.gguf")
                    os.replace(Path(tmp) / "combined.gguf", target)
            self._native = _read_stored(target)
        return self._native

    def _quantize_natively(self, out: Path) -> None:
        """The combined layout: written f16, then quantized by llama.cpp (in a child process) to ``out``."""
        arrays = self._build()
        f16 = out.with_name(out.stem + "-f16.gguf")
        _write(f16, self.spec, self.vocab, arrays.items(), f"synthetic {self.spec.arch} {self.spec.size} "
               f"{self.spec.weights}", self.metadata(), keep_f32=self._keep_f32())
        try:
            native_quant.quantize(f16, out, self.spec.dims.dtype)
        finally:
            f16.unlink(missing_ok=True)

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
        keys, trunk_keys, keep_f32 = self.metadata(), self.metadata(with_mtp=False), self._keep_f32()

        stored = None
        if self.native:
            if layout == "combined":
                self._quantize_natively(out)
                return
            # the other layouts hold the very bytes llama.cpp's quantizer wrote into the combined file
            native = self._native_tensors()
            stored = {id(arr): native[n] for n, arr in arrays.items()}

        def write(tensors: Iterable[tuple[str, np.ndarray]], name: str, **kw: Any) -> None:
            _write(out, spec, self.vocab, tensors, name, kw.pop("keys", keys), keep_f32=keep_f32, stored=stored,
                   **kw)

        def items(select: Any) -> list[tuple[str, np.ndarray]]:
            return [(n, a) for n, a in arrays.items() if select(n)]

        def is_mtp(name: str) -> bool:
            return name.startswith("blk.") and int(name.split(".")[1]) >= d.n_trunk

        def is_global(name: str) -> bool:
            # token_embd / output_norm / output, and whatever else the MTP graph
            # reads outside the blocks (deepseek4's output_hc_*); qwen4exp's output_hc_*
            # is the trunk's own mixer (its head has blk.N.nextn.hc_head_*)
            return not name.startswith("blk.") and not (spec.arch == "qwen4exp" and name.startswith("output_hc_"))

        if layout == "combined":
            write(arrays.items(), label)
        elif layout == "sharded":
            half = len(arrays) // 2 + 1
            write(arrays.items(), label, split_max_tensors=half)
        elif layout == "trunk":
            write(items(lambda n: not is_mtp(n)), label + " trunk", keys=trunk_keys)
        elif layout == "sidecar":
            write(items(lambda n: is_global(n) or is_mtp(n)), label + " MTP")
        elif layout == "sidecar-relative":
            renamed = [(_renumber(n, -d.n_trunk), a) for n, a in items(lambda n: is_global(n) or is_mtp(n))]
            write(renamed, label + " MTP (relative indices)")
        elif layout == "sidecar-duplicates" and spec.arch == "qwen4exp":
            # as shipped in the wild (seed 002): the head's mixer stored again as output_hc_*
            base = items(lambda n: is_global(n) or is_mtp(n))
            again = [(f"output_hc_{part}.weight", arrays[f"blk.{d.n_trunk}.nextn.hc_head_{part}.weight"])
                     for part in ("norm", "down", "up")]
            write(base + again, label + " MTP (head mixer stored twice)")
        elif layout == "sidecar-duplicates":
            base = items(lambda n: is_global(n) or is_mtp(n))
            legacy = [(n.replace(".nextn.shared_head_", ".shared_head."), a)
                      for n, a in base if ".nextn.shared_head_" in n]
            write(base + legacy, label + " MTP (duplicate names)")
        elif layout == "sidecar-missing":
            gone = ".nextn.eh_proj.weight" if spec.arch == "qwen4exp" else ".nextn.hnorm.weight"  # qwen4exp: no hnorm
            base = items(lambda n: (is_global(n) or is_mtp(n)) and not n.endswith(gone))
            write(base, label + " MTP (incomplete)")
        elif layout in ("sidecar-exact-duplicates", "sidecar-renumbered", "sidecar-offset"):
            _broken_sidecar(layout, out, write, items(lambda n: is_global(n) or is_mtp(n)), keys, d.n_trunk,
                            label + " MTP")
        else:  # sidecar-other-*: a sidecar generated for a different model
            other = _other_model(spec, layout)
            shutil.copyfile(SynthModel(other).path("sidecar"), out)


def _read_stored(path: Path) -> dict[str, tuple[np.ndarray, Any]]:
    """A GGUF's tensors as the writer takes them back: floats as numpy arrays, the rest as raw bytes and type."""
    import gguf

    floats = (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16)
    out: dict[str, tuple[np.ndarray, Any]] = {}
    for t in gguf.GGUFReader(path).tensors:
        data = np.array(t.data)  # a copy: the file may be replaced later
        out[t.name] = (data, None) if t.tensor_type in floats else (data, t.tensor_type)
    return out


def _renumber(name: str, delta: int) -> str:
    if not name.startswith("blk."):
        return name
    parts = name.split(".")
    parts[1] = str(int(parts[1]) + delta)
    return ".".join(parts)


def _broken_sidecar(layout: str, out: Path, write: Any, side: list[tuple[str, np.ndarray]], keys: dict[str, Any],
                    n_trunk: int, label: str) -> None:
    """The sidecar broken the way ``layout`` says (the doctor's and Repair's test cases)."""
    if layout == "sidecar-exact-duplicates":
        # GGUFWriter refuses a name twice: write the copy under a same-length stand-in, then rename it
        twice = f"blk.{n_trunk}.nextn.enorm.weight"
        if twice not in dict(side):  # qwen4exp's head has no enorm
            twice = f"blk.{n_trunk}.nextn.eh_proj.weight"
        stand_in = twice[:-1] + "X"
        write(side + [(stand_in, dict(side)[twice])], label + " (a tensor stored twice)")
        _rename_tensor(out, stand_in, twice)
    elif layout == "sidecar-renumbered":
        n_blocks, n_heads = keys["block_count"], keys["nextn_predict_layers"]
        per_layer = {k: v[-n_heads:] for k, v in keys.items() if isinstance(v, list) and len(v) == n_blocks}
        write([(_renumber(n, -n_trunk), a) for n, a in side], label + " (renumbered metadata)",
              keys={**keys, **per_layer, "block_count": n_heads})
    else:
        write([(_renumber(n, 2), a) for n, a in side], label + " (blocks at a wrong offset)")


def _rename_tensor(path: Path, old: str, new: str) -> None:
    """Rename a tensor in place (same length: only the header's string bytes change)."""
    import struct

    assert len(old) == len(new)
    entry = struct.pack("<Q", len(old)) + old.encode()
    data = path.read_bytes()
    at = data.index(entry)
    with path.open("r+b") as f:
        f.seek(at + 8)
        f.write(new.encode())


def _other_model(spec: SynthSpec, layout: str) -> SynthSpec:
    """The spec of a model that differs from ``spec`` in one way (see spec.SIZES)."""
    return spec.with_(size=f"{spec.size}-{layout.removeprefix('sidecar-')}")


def _atomic_text(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".partial")
    tmp.write_text(text)
    os.replace(tmp, path)
