"""Synthetic vision projectors (``mmproj-*.gguf``) for synthetic targets, as llama.cpp's ``mtmd`` loads them.

Qwen3.5 / 3.6 targets ship their vision tower as a separate ``mmproj`` GGUF of
projector type ``qwen3vl_merger`` (llama.cpp's ``conversion/qwen3vl.py``
registers ``Qwen3_5ForConditionalGeneration`` there). This module writes such
a file with tiny dimensions and random weights, its keys and tensor names
exactly the ones ``tools/mtmd/clip.cpp`` reads (``clip-impl.h``: ``KEY_*``,
``TN_*``; ``clip_model_loader::load_tensors``, the ``PROJECTOR_TYPE_QWEN3VL``
case; the graph in ``models/qwen3vl.cpp``):

- the patch embedding is a Conv3D split in two Conv2Ds (``v.patch_embd.weight``
  and ``.weight.1``) plus ``v.patch_embd.bias`` (the graph asserts the bias),
- learned position embeddings ``v.position_embd.weight`` (asserted), a square
  grid the graph interpolates to the image's patch grid,
- ``n_layer`` ViT blocks (``v.blk.N.{ln1,ln2,attn_qkv,attn_out,ffn_up,ffn_down}``),
  a final ``v.post_ln``, and the merger MLP ``mm.0`` / ``mm.2`` that maps 2x2
  merged patches to the text model's embedding width.

``mtmd_init_from_file`` refuses a projector whose output width (``mm.2.bias``'s
length; no deepstack layers here) differs from the target's input embedding
width, so ``projection_dim`` defaults to the target's ``n_embd``; a projector
made for another width is what the doctor's mismatch tests load.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from engine.synth.kv import add_keys
from engine.synth.spec import SynthSpec
from engine.synth.writer import SynthModel

PROJECTOR_VERSION = 1  # bump when the file a spec produces changes
PROJECTOR_TYPES = ("qwen3vl_merger",)
# the target architectures whose released vision models use each projector type
PROJECTOR_TARGETS = {"qwen3vl_merger": ("qwen35", "qwen35moe")}
MERGE = 2  # spatial merge: 2x2 patches become one image token (clip.vision.spatial_merge_size)


@dataclass(frozen=True)
class ProjectorSpec:
    """A tiny vision projector for the synthetic target ``target``.

    Attributes:
        target: the text model the projector feeds.
        projector_type: llama.cpp's ``clip.projector_type`` string.
        n_embd, n_head, n_ff, n_layer: the vision tower's sizes (head width n_embd / n_head,
            a multiple of 4: M-RoPE splits it in four sections).
        patch_size: pixels per patch side; an image side is resized to a multiple of
            ``patch_size * 2``. image_size / patch_size patches per side of the learned grid.
        projection_dim: the output width; None: the target's embedding width (what fits).
        seed: the weights' seed.
    """

    target: SynthSpec
    projector_type: str = "qwen3vl_merger"
    n_embd: int = 32
    n_head: int = 2
    n_ff: int = 64
    n_layer: int = 2
    patch_size: int = 4
    image_size: int = 32
    projection_dim: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.projector_type not in PROJECTOR_TYPES:
            raise ValueError(f"unknown projector type {self.projector_type!r}; expected one of {PROJECTOR_TYPES}")
        if self.target.arch not in PROJECTOR_TARGETS[self.projector_type]:
            raise ValueError(f"a {self.projector_type} projector feeds {PROJECTOR_TARGETS[self.projector_type]} "
                             f"targets, not {self.target.arch}")
        if self.n_embd % self.n_head or (self.n_embd // self.n_head) % 4:
            raise ValueError("the vision head width (n_embd / n_head) must be a multiple of 4 (M-RoPE sections)")
        if self.image_size % (self.patch_size * MERGE):
            raise ValueError(f"image_size must be a multiple of patch_size * {MERGE}")

    @property
    def width(self) -> int:
        """The width of the embeddings the projector writes (one row per image token)."""
        return self.projection_dim if self.projection_dim is not None else self.target.dims.n_embd

    def key(self) -> str:
        blob = json.dumps({"v": PROJECTOR_VERSION, **asdict(self)}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:10]


def tensors(spec: ProjectorSpec) -> dict[str, tuple[tuple[int, ...], str]]:
    """Every tensor the loader and the graph read: name -> (numpy shape, role).

    Roles: ``weight`` (random, scaled by fan-in), ``norm`` (ones), ``bias`` (small random).
    """
    e, ff, p = spec.n_embd, spec.n_ff, spec.patch_size
    grid = (spec.image_size // p) ** 2
    merged = e * MERGE * MERGE
    out: dict[str, tuple[tuple[int, ...], str]] = {
        # ggml {p, p, 3, e}: numpy (e, 3, p, p), one Conv2D per frame of the temporal pair
        "v.patch_embd.weight": ((e, 3, p, p), "weight"),
        "v.patch_embd.weight.1": ((e, 3, p, p), "weight"),
        "v.patch_embd.bias": ((e,), "bias"),
        "v.position_embd.weight": ((grid, e), "weight"),
        "v.post_ln.weight": ((e,), "norm"),
        "v.post_ln.bias": ((e,), "bias"),
        "mm.0.weight": ((merged, merged), "weight"),
        "mm.0.bias": ((merged,), "bias"),
        "mm.2.weight": ((spec.width, merged), "weight"),
        "mm.2.bias": ((spec.width,), "bias"),
    }
    for i in range(spec.n_layer):
        b = f"v.blk.{i}"
        out.update({
            f"{b}.ln1.weight": ((e,), "norm"), f"{b}.ln1.bias": ((e,), "bias"),
            f"{b}.attn_qkv.weight": ((3 * e, e), "weight"), f"{b}.attn_qkv.bias": ((3 * e,), "bias"),
            f"{b}.attn_out.weight": ((e, e), "weight"), f"{b}.attn_out.bias": ((e,), "bias"),
            f"{b}.ln2.weight": ((e,), "norm"), f"{b}.ln2.bias": ((e,), "bias"),
            f"{b}.ffn_up.weight": ((ff, e), "weight"), f"{b}.ffn_up.bias": ((ff,), "bias"),
            f"{b}.ffn_down.weight": ((e, ff), "weight"), f"{b}.ffn_down.bias": ((e,), "bias"),
        })
    return out


def keys(spec: ProjectorSpec) -> dict[str, object]:
    """The metadata ``clip_model_loader`` reads (``load_hparams``), full key names."""
    return {
        "clip.has_vision_encoder": True,
        "clip.projector_type": spec.projector_type,
        "clip.use_gelu": True,
        "clip.vision.embedding_length": spec.n_embd,
        "clip.vision.feed_forward_length": spec.n_ff,
        "clip.vision.block_count": spec.n_layer,
        "clip.vision.projection_dim": spec.width,
        "clip.vision.attention.head_count": spec.n_head,
        "clip.vision.attention.layer_norm_epsilon": 1e-6,
        "clip.vision.image_size": spec.image_size,
        "clip.vision.patch_size": spec.patch_size,
        "clip.vision.spatial_merge_size": MERGE,
        "clip.vision.image_mean": [0.5, 0.5, 0.5],
        "clip.vision.image_std": [0.5, 0.5, 0.5],
    }


def _array(spec: ProjectorSpec, name: str, shape: tuple[int, ...], role: str) -> np.ndarray:
    if role == "norm":
        return np.ones(shape, dtype=np.float32)
    digest = hashlib.sha256(f"{spec.seed}:{name}".encode()).digest()
    rng = np.random.default_rng(int.from_bytes(digest[:8], "little"))
    values = rng.standard_normal(shape, dtype=np.float32)
    if role == "bias":
        return (values * 0.02).astype(np.float32)
    fan_in = int(np.prod(shape[1:]))
    return (values / np.sqrt(fan_in)).astype(np.float32)


def write(spec: ProjectorSpec, path: Path) -> None:
    """Write the projector to ``path`` (f32 throughout: tiny, and every CPU op takes it)."""
    import gguf

    writer = gguf.GGUFWriter(path, "clip")
    writer.add_name(f"synthetic {spec.projector_type} projector for {spec.target.arch}")
    add_keys(writer, keys(spec))
    for name, (shape, role) in tensors(spec).items():
        writer.add_tensor(name, _array(spec, name, shape, role))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def projector_path(spec: ProjectorSpec) -> Path:
    """The projector's file beside its target's files (generated once, cached by the spec's key).

    Named ``mmproj-….gguf`` as released projectors are, so the store finds it as a projector.
    """
    folder = SynthModel(spec.target).dir
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"mmproj-{spec.projector_type}-{spec.key()}.gguf"
    if not target.exists():
        with tempfile.TemporaryDirectory(dir=folder) as tmp:
            out = Path(tmp) / target.name
            write(spec, out)
            os.replace(out, target)
    return target
