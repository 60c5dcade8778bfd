"""Which tensor names llama.cpp's loader consumes, per MTP architecture.

Why a table: llama.cpp refuses a file holding a tensor its loader does not
create ("wrong number of tensors"), and refuses or aborts when one it needs
is missing. A hand-written allowlist drifted from the loaders and refused
valid deepseek32 / glm-dsa / deepseek4 sidecars (indexer and hyper-connection
tensors). The ``gguf`` package on PyPI does not know 5 of the 14 MTP
architectures, so the truth is read from the llama.cpp vendored in
llama-cpp-python: ``LLM_TENSOR_NAMES`` (src/llama-arch.cpp), each
architecture's ``load_arch_tensors`` (src/models/*.cpp), the shared helpers
and the generic ``.scale`` pass (src/llama-model.cpp). The result is
``engine/loader_tensors_table.py``; regenerate it after an engine bump or a
change to our patch series (``packaging/patches/``, applied to a copy of the
vendored tree first, since the patches add tensors: qwen4exp's MTP head):

    python -m engine.loader_tensors /path/to/llama_cpp_python-X/vendor/llama.cpp
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path

from engine.loader_tensors_table import ARCH_TENSORS, OUTPUT_TIED, REQUIRED_GLOBALS

_NUMBER = re.compile(r"(?<![^.])\d+(?![^.])")  # a whole dot-separated component


def pattern(name: str) -> str:
    """``blk.12.ffn_gate.3.weight`` -> ``blk.#.ffn_gate.#.weight`` (the table's form)."""
    return _NUMBER.sub("#", name)


@cache
def _allowed(arch: str) -> frozenset[str]:
    return frozenset(ARCH_TENSORS.get(arch, ()))


def known(arch: str) -> bool:
    return arch in ARCH_TENSORS


def unconsumed(arch: str, names: tuple[str, ...] | list[str]) -> list[str]:
    """Names in a file of ``arch`` that its llama.cpp loader would not create."""
    allowed = _allowed(arch)
    return [n for n in names if pattern(n) not in allowed]


def required_globals(arch: str) -> tuple[str, ...]:
    """Non-block tensors the loader requires in every file of ``arch``, a sidecar included."""
    return REQUIRED_GLOBALS.get(arch, ())


def output_tied(arch: str) -> bool:
    """True if a missing ``output.weight`` falls back to ``token_embd.weight`` (tied LM head)."""
    return arch in OUTPUT_TIED


# -- generation from the vendored llama.cpp sources ---------------------------------------------

_TN = re.compile(r"\btn\(\s*(LLM_TENSOR_\w+)\s*(?:,\s*\"(\w+)\")?")
_GLOBAL_CREATE = re.compile(
    r"create_tensor\(\s*tn\(\s*(LLM_TENSOR_\w+)\s*,\s*\"(\w+)\"\s*\)\s*,\s*\{[^}]*\}\s*,\s*([^;]*?)\)\s*;")


def _body(text: str, signature: str) -> str:
    """The brace-matched body of the function whose definition starts with ``signature``."""
    start = text.find(signature)
    if start < 0:
        return ""
    i = text.index("{", start)
    depth = 0
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j + 1]
    raise ValueError(f"unbalanced braces after {signature!r}")


def _table(text: str, name: str) -> dict[str, str]:
    block = text[text.index(name):]
    block = block[:block.index("};")]
    return dict(re.findall(r"\{\s*(\w+)\s*,\s*\"([^\"]*)\"\s*\}", block))


def generate(vendor: Path, archs: tuple[str, ...]) -> tuple[dict[str, list[str]], dict[str, list[str]], list[str]]:
    """Read the vendored llama.cpp; return (tensor patterns, required globals, tied archs) per arch."""
    src = Path(vendor) / "src"
    arch_cpp = (src / "llama-arch.cpp").read_text()
    model_cpp = (src / "llama-model.cpp").read_text()
    models_h = (src / "models" / "models.h").read_text()
    arch_names = {v: k for k, v in _table(arch_cpp, "LLM_ARCH_NAMES").items()}
    tensor_names = _table(arch_cpp, "LLM_TENSOR_NAMES")
    classes = dict(re.findall(r"case (LLM_ARCH_\w+):\s*return new (llama_model_\w+)\(", model_cpp))
    bases = dict(re.findall(r"struct (llama_model_\w+) : public (llama_model_\w+)", models_h))
    sources = {p: p.read_text() for p in sorted((src / "models").glob("*.cpp"))}
    helpers = {m: _body(model_cpp, f"llama_model_base::{m}(")
               for m in re.findall(r"void llama_model_base::(create_tensor_\w+)\(", model_cpp)}
    generic = model_cpp[model_cpp.index("generic pass: load optional per-tensor"):]
    generic = generic[:generic.index("ml.done_getting_tensors()")]
    scale_pass = set(_TN.findall(generic))

    def loader(cls: str) -> str:
        while cls:
            sig = f"void {cls}::load_arch_tensors("
            for text in sources.values():
                if sig in text:
                    return _body(text, sig)
            cls = bases.get(cls, "")
        raise ValueError("no load_arch_tensors found")

    def name(enum: str, suffix: str) -> str:
        return pattern(tensor_names[enum].replace("%d", "0")) + (f".{suffix}" if suffix else "")

    tensors: dict[str, list[str]] = {}
    required: dict[str, list[str]] = {}
    tied: list[str] = []
    for arch in archs:
        body = loader(classes[arch_names[arch]])
        for helper, hbody in helpers.items():
            if re.search(rf"\b{helper}\(", body):
                body += hbody
        if len(re.findall(r"\btn\(", body)) != len(_TN.findall(body)):
            raise ValueError(f"{arch}: a tn(...) call names its tensor through a variable; extend the generator")
        calls = set(_TN.findall(body))
        calls |= {(enum, suffix) for enum, suffix in scale_pass if (enum, "weight") in calls}
        tensors[arch] = sorted({name(enum, suffix) for enum, suffix in calls})
        creates = _GLOBAL_CREATE.findall(body)
        required[arch] = sorted({name(enum, suffix) for enum, suffix, flags in creates if flags.strip() == "0"})
        if any(enum == "LLM_TENSOR_TOKEN_EMBD" and "TENSOR_DUPLICATED" in flags for enum, _s, flags in creates):
            tied.append(arch)
    return tensors, required, tied


def _q(s: str) -> str:
    return f'"{s}"'


def render(tensors: dict[str, list[str]], required: dict[str, list[str]], tied: list[str], origin: str) -> str:
    """The text of ``engine/loader_tensors_table.py``."""
    out = ['"""GENERATED by ``python -m engine.loader_tensors`` from the llama.cpp vendored in',
           f"{origin}. Do not edit by hand; see engine/loader_tensors.py.",
           "",
           "Names are patterns: every block or expert index is ``#``.", '"""', "",
           "ARCH_TENSORS: dict[str, tuple[str, ...]] = {"]
    for arch, names in tensors.items():
        out.append(f"    {_q(arch)}: (")
        out += [f"        {_q(n)}," for n in names]
        out.append("    ),")
    out += ["}", "", "# Non-block tensors each loader requires (flags 0), in a sidecar too.",
            "REQUIRED_GLOBALS: dict[str, tuple[str, ...]] = {"]
    for arch, names in required.items():
        out.append(f"    {_q(arch)}: (")
        out += [f"        {_q(n)}," for n in names]
        out.append("    ),")
    out += ["}", "", "# Loaders that use token_embd as the LM head when output.weight is absent.",
            "OUTPUT_TIED = frozenset({"]
    out += [f"    {_q(arch)}," for arch in tied]
    out += ["})", ""]
    return "\n".join(out)


PATCH_DIR = Path(__file__).resolve().parents[1] / "packaging" / "patches"


def patched_copy(vendor: Path, into: Path, patches: list[Path]) -> Path:
    """A copy of ``vendor`` with ``patches`` applied in order (``patch -p1``, as the wheel build does)."""
    tree = into / "llama.cpp"
    shutil.copytree(vendor, tree, ignore=shutil.ignore_patterns(".git", "build*"), symlinks=True)
    for p in patches:
        proc = subprocess.run(["patch", "-p1", "--batch", "--forward", "-i", str(p)], cwd=tree,
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{p.name} does not apply to {vendor}:\n{proc.stdout}{proc.stderr}")
    return tree


def main(argv: list[str] | None = None) -> int:
    from engine.sidecar import MTP_ARCHITECTURES

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m engine.loader_tensors VENDOR/llama.cpp", file=sys.stderr)
        return 2
    vendor = Path(args[0])
    archs = tuple(sorted(MTP_ARCHITECTURES))
    patches = sorted(PATCH_DIR.glob("*.patch"))
    origin = vendor.parent.parent.name or str(vendor)
    with tempfile.TemporaryDirectory() as tmp:
        tree = patched_copy(vendor, Path(tmp), patches) if patches else vendor
        if patches:
            origin += f" + packaging/patches/ ({len(patches)} patches)"
        text = render(*generate(tree, archs), origin=origin)
    target = Path(__file__).with_name("loader_tensors_table.py")
    target.write_text(text)
    print(f"wrote {target} ({len(archs)} architectures)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
