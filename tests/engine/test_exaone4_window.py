"""EXAONE 4's window: llama.cpp reads it from every GGUF but windows only the 64-layer 32B
(models/exaone4.cpp), while ``llama_model_n_swa`` reports it for all (engine/gguf/facts.py ``windowed``).
Tiny EXAONE 4 files of both kinds, written here (the synthetic models do not cover this architecture)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.generation.parallel import ParallelGenerator
from engine.generation.sequences import Sequences
from engine.generation.session import LoadOptions, Session
from engine.runtime.model import Model
from engine.synth.kv import add_vocabulary
from engine.synth.tokenizer import build_vocabulary

WINDOW = 16


def exaone4(path: Path, n_layer: int) -> Path:
    """An EXAONE 4 GGUF with ``n_layer`` layers of random weights and a sliding window in its metadata."""
    import gguf

    n_embd, n_head, n_kv, hd, n_ff = 64, 4, 2, 16, 128
    writer = gguf.GGUFWriter(str(path), "exaone4")
    writer.add_name("tiny exaone4")
    writer.add_context_length(256)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_kv)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_sliding_window(WINDOW)
    vocab = build_vocabulary(512)
    add_vocabulary(writer, vocab)
    rng = np.random.default_rng(0)

    def weight(name: str, *shape: int) -> None:
        writer.add_tensor(name, (rng.standard_normal(shape) * 0.02).astype(np.float32))

    def norm(name: str, n: int) -> None:
        writer.add_tensor(name, np.ones(n, dtype=np.float32))

    weight("token_embd.weight", len(vocab.tokens), n_embd)
    norm("output_norm.weight", n_embd)
    for i in range(n_layer):
        weight(f"blk.{i}.attn_q.weight", n_head * hd, n_embd)
        weight(f"blk.{i}.attn_k.weight", n_kv * hd, n_embd)
        weight(f"blk.{i}.attn_v.weight", n_kv * hd, n_embd)
        weight(f"blk.{i}.attn_output.weight", n_embd, n_head * hd)
        norm(f"blk.{i}.attn_q_norm.weight", hd)
        norm(f"blk.{i}.attn_k_norm.weight", hd)
        norm(f"blk.{i}.post_attention_norm.weight", n_embd)
        weight(f"blk.{i}.ffn_gate.weight", n_ff, n_embd)
        weight(f"blk.{i}.ffn_up.weight", n_ff, n_embd)
        weight(f"blk.{i}.ffn_down.weight", n_embd, n_ff)
        norm(f"blk.{i}.post_ffw_norm.weight", n_embd)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize(("n_layer", "window"), [(2, 0), (64, WINDOW)], ids=["1.2B-like", "32B-like"])
def test_only_the_64_layer_exaone4_counts_as_windowed(tmp_path: Path, n_layer: int, window: int):
    path = exaone4(tmp_path / f"exaone4-{n_layer}.gguf", n_layer)
    model = Model(path)
    try:
        assert model.n_swa == window
    finally:
        model.close()
    with Session(LoadOptions(path=str(path), n_ctx=256, parallel=2)) as session:
        # a window-only cache takes a copy of the window at each prompt's end and keeps sequences in one pool
        # from sharing prompt cells; a cache that keeps every cell does neither
        assert session.window_cache == bool(window)
        assert Sequences(session).can_share() == (not window)
        # a prompt chunk is decoded beside running replies either way (only DeepSeek V4's are read alone)
        assert ParallelGenerator(session).chunks_share_batch
