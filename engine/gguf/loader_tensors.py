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
``engine/gguf/loader_tensors_table.py``, written by
``packaging/generate_loader_tensors.py``; regenerate it after an engine bump
or a change to our patch series (``packaging/patches/``, applied to a copy of
the vendored tree first, since the patches add tensors: qwen4exp's MTP head):

    python packaging/generate_loader_tensors.py /path/to/llama_cpp_python-X/vendor/llama.cpp
"""

from __future__ import annotations

import re
from functools import cache

from engine.gguf.loader_tensors_table import ARCH_TENSORS, OUTPUT_TIED, REQUIRED_GLOBALS

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
