"""The key/value part of a synthetic GGUF: architecture keys and the tokenizer.

Shared by the file writer and the tensor probe (``engine.synth.probe``), so the
probe asks llama.cpp about exactly the metadata the real file will carry.
"""

from __future__ import annotations

from typing import Any

from engine.synth.tokenizer import Vocabulary


def add_arch_keys(writer: Any, arch: str, keys: dict[str, Any]) -> None:
    """Write ``keys`` (names without the ``<arch>.`` prefix) with the types llama.cpp reads."""
    add_keys(writer, {f"{arch}.{key}": value for key, value in keys.items()})


def add_keys(writer: Any, keys: dict[str, Any]) -> None:
    """Write ``keys`` (full names) with the types llama.cpp reads.

    Python ints become uint32, floats float32; lists become arrays of their
    elements' type (int32 or float32), which llama.cpp's array readers accept.
    """
    for key, value in keys.items():
        if isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        elif isinstance(value, str):
            writer.add_string(key, value)
        else:
            writer.add_array(key, list(value))


def add_vocabulary(writer: Any, vocab: Vocabulary) -> None:
    """The GPT-2 style synthetic tokenizer (see ``engine.synth.tokenizer``)."""
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.types)
    writer.add_token_merges(vocab.merges)
    writer.add_bos_token_id(vocab.bos)
    writer.add_eos_token_id(vocab.eos)
    writer.add_add_bos_token(False)
