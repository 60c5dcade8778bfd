"""Vision projectors (``mmproj-*.gguf``): told apart from models, described from their header, and
checked against a target before llama.cpp sees them.

A vision-language model ships its image encoder as a separate GGUF beside the
target (and the MTP sidecar). llama.cpp's own rule (``common/download.cpp``,
``gguf_filename_is_model``) is the file name: anything containing "mmproj" is
not a model. Its header says the same: ``general.architecture`` is ``clip``.
Either makes a file a projector here, so a projector is never offered as a
model to load.

What must match: ``mtmd_init_from_file`` refuses a projector whose output
width is not the text model's input embedding width (``clip_n_mmproj_embd``
against ``llama_model_n_embd_inp``) -- the doctor says so before a load does,
with both widths -- and a projector converted for another family encodes
images its target was never trained on, which loads but answers nonsense.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from engine.errors import ModelFileError
from engine.gguf.facts import GGUFFacts, read_facts
from engine.gguf.header import Header, read_header
from engine.gguf.sidecar import Finding

PROJECTOR_ARCH = "clip"
# The text architectures each projector type was converted for (llama.cpp's conversion/*.py:
# Qwen3-VL and Qwen3.5 / 3.6 share qwen3vl_merger; Qwen2-VL and 2.5-VL their own).
PROJECTOR_FAMILIES: dict[str, tuple[str, ...]] = {
    "qwen3vl_merger": ("qwen35", "qwen35moe", "qwen3vl", "qwen3vlmoe"),
    "qwen2vl_merger": ("qwen2vl",),
    "qwen2.5vl_merger": ("qwen2vl",),
}
# Projector types whose output width is mm.2's length (times 1 + deepstack layers for qwen3vl_merger),
# as clip.cpp's clip_n_mmproj_embd computes it; for the others the header's projection_dim is taken.
_MERGER_OUTPUT = ("qwen2vl_merger", "qwen2.5vl_merger", "qwen3vl_merger")
MAX_WIDTH = 1 << 24


def is_projector_name(path: str | Path) -> bool:
    """llama.cpp's naming rule: a GGUF whose file name contains "mmproj" is a projector, not a model."""
    name = Path(path).name.lower()
    return name.endswith(".gguf") and "mmproj" in name


@dataclass(frozen=True)
class ProjectorFacts:
    """What a projector's header says: its type, what it encodes, and how wide its output rows are."""

    path: Path
    name: str
    projector_type: str
    vision: bool
    audio: bool
    width: int | None  # output embedding width; None when the header does not say
    file_size: int
    n_params: int
    quantization: dict[str, int] = field(default_factory=dict)

    @property
    def families(self) -> tuple[str, ...]:
        """The text architectures this projector type was converted for (empty: not known here)."""
        return PROJECTOR_FAMILIES.get(self.projector_type, ())

    def summary_lines(self) -> list[str]:
        width = f"{self.width}" if self.width is not None else "not stated"
        encodes = " and ".join(k for k, on in (("images", self.vision), ("audio", self.audio)) if on) or "nothing"
        return [
            f"file          {self.path}",
            f"projector     {self.projector_type}" + (f"  ({self.name})" if self.name else ""),
            f"encodes       {encodes}",
            f"output width  {width} (must equal the target's embedding width)",
            f"size          {self.file_size / 2**20:.1f} MiB, {self.n_params / 1e6:.1f} M parameters",
        ]


def read_projector(path: str | Path) -> ProjectorFacts:
    """A projector's facts from its header.

    Raises:
        ModelFileError: unreadable, not a GGUF, or not a projector (its architecture is not ``clip``).
    """
    path = Path(path)
    header = read_header(path)
    arch = header.get("general.architecture", "string")
    if arch != PROJECTOR_ARCH:
        raise ModelFileError(f"{path.name} is not a vision projector: its architecture is {arch!r}, not "
                             f"{PROJECTOR_ARCH!r}. Projectors are the mmproj-*.gguf files beside a model.")
    vision = bool(header.get("clip.has_vision_encoder", "bool", False))
    audio = bool(header.get("clip.has_audio_encoder", "bool", False))
    kind = (header.get("clip.projector_type", "string")
            or header.get("clip.vision.projector_type", "string") or "unknown")
    from gguf.constants import GGMLQuantizationType

    quant: dict[str, int] = {}
    for tensor in header.tensors:
        try:
            type_name = GGMLQuantizationType(tensor.ggml_type).name
        except ValueError:
            type_name = f"type{tensor.ggml_type}"
        quant[type_name] = quant.get(type_name, 0) + 1
    return ProjectorFacts(
        path=path, name=header.get("general.name", "string", ""), projector_type=kind, vision=vision, audio=audio,
        width=_width(header, kind), file_size=header.file_size,
        n_params=sum(t.n_elements for t in header.tensors), quantization=quant,
    )


def _width(header: Header, kind: str) -> int | None:
    """The output width clip.cpp computes for this projector type (``clip_n_mmproj_embd``)."""
    shapes = {t.name: t.shape for t in header.tensors}
    if kind in _MERGER_OUTPUT and "mm.2.bias" in shapes:
        deepstack = {name.split(".")[2] for name in shapes if name.startswith("v.deepstack.")}
        return int(shapes["mm.2.bias"][0]) * (1 + (len(deepstack) if kind == "qwen3vl_merger" else 0))
    stated = header.integer("clip.vision.projection_dim", high=MAX_WIDTH)
    return stated if stated else None


def target_input_width(target: GGUFFacts) -> int:
    """The width of the rows the target takes as input (``llama_model_n_embd_inp``): its embedding
    width, times 1 + the deepstack layers of Qwen3-VL text models, which take the projector's extra rows."""
    deepstack = 0
    if target.architecture in ("qwen3vl", "qwen3vlmoe"):
        deepstack = read_header(target.path).integer(f"{target.architecture}.n_deepstack_layers", 0, high=64)
    return target.n_embd * (1 + deepstack)


@dataclass
class ProjectorDiagnosis:
    """Does this projector fit this target: findings in plain words, as the sidecar doctor gives them."""

    target: GGUFFacts
    projector: ProjectorFacts
    findings: list[Finding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not any(f.severity == "error" for f in self.findings)

    def verdict(self) -> str:
        proj, tgt = self.projector.path.name, self.target.path.name
        if self.ok:
            return f"{proj} fits {tgt}" + (", with warnings." if any(f.severity == "warning" for f in self.findings)
                                           else ".")
        return f"{proj} cannot be used with {tgt}; get the projector made for this model."

    def report(self) -> str:
        mark = {"ok": "ok  ", "warning": "warn", "error": "FAIL"}
        return "\n".join([self.verdict(), ""] + [f"  [{mark[f.severity]}] {f.text}" for f in self.findings])


def diagnose_projector(target_path: str | Path, projector_path: str | Path) -> ProjectorDiagnosis:
    """Check ``projector_path`` against ``target_path`` from both headers (nothing is loaded).

    Raises:
        ModelFileError: either file is unreadable, or the projector is not one.
    """
    target, projector = read_facts(target_path), read_projector(projector_path)
    out = ProjectorDiagnosis(target, projector)
    add = out.findings.append
    if not projector.vision:
        add(Finding("error", f"{projector.path.name} has no vision encoder (clip.has_vision_encoder is not set): "
                             "it cannot encode images."))
    needed = target_input_width(target)
    if projector.width is None:
        add(Finding("warning", f"the header does not state the projector's output width ({projector.projector_type}"
                               "); llama.cpp checks it when it loads the pair."))
    elif projector.width != needed:
        add(Finding("error", f"the projector writes rows {projector.width} wide; {target.path.name} takes "
                             f"{needed} ({target.architecture}, embedding width {target.n_embd}). It was made for "
                             "another model: get the mmproj file from this model's repository."))
    else:
        add(Finding("ok", f"projection width {projector.width} = the target's embedding width."))
    families = projector.families
    if not families:
        add(Finding("warning", f"projector type {projector.projector_type!r} is not one this doctor knows the "
                               "family of; whether it suits this model is not checked."))
    elif target.architecture not in families:
        add(Finding("error", f"a {projector.projector_type} projector belongs to {', '.join(families)} models; "
                             f"{target.path.name} is {target.architecture}. Its images would mean nothing to "
                             "this model: get the projector from this model's repository."))
    else:
        add(Finding("ok", f"{projector.projector_type} belongs to {target.architecture} models."))
    return out
