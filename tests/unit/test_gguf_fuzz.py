"""A seeded mini-fuzz of the GGUF header reader (issue 17, items 5 and 6).

Every file the app meets goes through ``engine.gguf.facts.read_facts`` before
llama.cpp sees it, and the doctor's rules (``engine.gguf.sidecar.assess``) run on
what it returns. Whatever the bytes, the only exception either may raise is
ModelFileError: anything else is a traceback in ``mtp-studio info``, a dead
``models list`` or an empty Models page. A few hundred mutations of a synthetic
sidecar's header (random bytes aimed at its structure, and metadata values of
random types), with a fixed seed so that a failure reproduces.
"""

from __future__ import annotations

import math
import random
import struct
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from engine.errors import ModelFileError, SpeculativeUnavailable
from engine.gguf.facts import GGUFFacts, read_facts
from engine.gguf.sidecar import assess, check_target_has_mtp
from tests import gguf_mutate as G
from tests.engine.conftest import synth

SEED = 17
CASES = 600
PER_CASE = 2.0  # seconds
IMPORTANT = ["general.architecture", "general.alignment", "split.count", "glm4moe.block_count",
             "glm4moe.nextn_predict_layers", "glm4moe.embedding_length", "glm4moe.context_length",
             "tokenizer.ggml.tokens", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
             "tokenizer.chat_template", "glm4moe.hyper_connection.count", "glm4moe.embedding_length_out"]
EXTREMES = [0, 1, 2, 5, 7, 255, 4096, 4097, 2**31 - 1, 2**31, 2**32 - 1, 2**63 - 1, 2**63, 2**64 - 1]


def _random_scalar(rng: random.Random) -> bytes:
    vtype = rng.choice([G.UINT8, G.INT8, G.UINT16, G.INT16, G.UINT32, G.INT32, G.FLOAT32, G.BOOL, G.UINT64,
                        G.INT64, G.FLOAT64])
    if vtype in (G.FLOAT32, G.FLOAT64):
        return G.value(vtype, rng.choice([math.nan, math.inf, -math.inf, 0.0, 5.0, 1e30, -1.0]))
    if vtype == G.BOOL:
        return G.value(vtype, rng.random() < 0.5)
    bits = {G.UINT8: 8, G.INT8: 8, G.UINT16: 16, G.INT16: 16, G.UINT32: 32, G.INT32: 32}.get(vtype, 64)
    signed = vtype in (G.INT8, G.INT16, G.INT32, G.INT64)
    raw = rng.choice(EXTREMES) % 2**bits
    return G.value(vtype, raw - 2**bits if signed and raw >= 2 ** (bits - 1) else raw)


def _random_value(rng: random.Random) -> bytes:
    """A metadata value of a random GGUF type, sometimes one whose counts lie."""
    roll = rng.random()
    if roll < 0.45:
        return _random_scalar(rng)
    if roll < 0.6:
        return G.value(G.STRING, rng.choice(["", "five", "glm4moe", "\u00e9" * 300, "{{ x }}"]))
    if roll < 0.75:
        item = rng.choice([G.UINT8, G.UINT32, G.INT64, G.FLOAT32, G.STRING])
        items = [rng.randrange(100) for _ in range(rng.randrange(5))]
        return G.array(item, [str(i) for i in items] if item == G.STRING else items)
    if roll < 0.87:
        return G.nested_array(rng.choice([2, 5, 40, 1000, 5000]))
    raw = G.array(G.STRING, ["a", "b"])  # an array whose count lies
    return raw[:8] + struct.pack("<Q", rng.choice(EXTREMES[3:])) + raw[16:]


def _field_mutation(rng: random.Random, g: G.Gguf) -> tuple[str, bytes]:
    key = rng.choice(IMPORTANT + list(g.kv))
    return f"{key} := random value", g.with_kv(key, _random_value(rng)).to_bytes()


def _byte_mutation(rng: random.Random, g: G.Gguf) -> tuple[str, bytes]:
    """Overwrite bytes near the start of a random piece of the header (a count, a key's
    length or type, an array count, a tensor's dimensions), or cut the file short."""
    data = bytearray(g.to_bytes())
    label, start, end = rng.choice(g.spans())
    pos = rng.randrange(start, min(end, start + 28))
    roll = rng.random()
    if roll < 0.1:
        return f"cut at {pos} in {label}", bytes(data[:pos])
    if roll < 0.55:
        data[pos:pos + 8] = struct.pack("<Q", rng.choice(EXTREMES))
        return f"u64 at {pos} in {label}", bytes(data)
    n = rng.randrange(1, 5)
    data[pos:pos + n] = rng.randbytes(n)
    return f"{n} random bytes at {pos} in {label}", bytes(data)


def _judge(target: GGUFFacts, path: Path) -> None:
    """What the app does with a file: read its facts, show them, and judge it as a sidecar and as a target."""
    facts = read_facts(path)
    facts.summary_lines()
    assess(target, facts)
    assess(facts, facts)
    try:
        check_target_has_mtp(facts)
    except SpeculativeUnavailable:
        pass


@pytest.mark.timeout(120)
def test_a_few_hundred_mutated_headers_give_model_file_errors_or_facts_and_nothing_else(tmp_path):
    model = synth("glm4moe")
    target = read_facts(model.path())
    base = G.parse(model.path("sidecar"))
    rng = random.Random(SEED)
    mutations: list[Callable[[random.Random, G.Gguf], tuple[str, bytes]]] = [_field_mutation, _byte_mutation]
    path = tmp_path / "mtp-fuzz.gguf"
    failures, outcomes = [], {"facts": 0, "refused": 0}
    for case in range(CASES):
        what, data = rng.choice(mutations)(rng, base)
        path.write_bytes(data)
        start = time.monotonic()
        try:
            _judge(target, path)
            outcomes["facts"] += 1
        except ModelFileError:
            outcomes["refused"] += 1
        except Exception as exc:  # the point: nothing else may come out
            failures.append(f"case {case} ({what}): {type(exc).__name__}: {str(exc)[:200]}")
        if time.monotonic() - start > PER_CASE:
            failures.append(f"case {case} ({what}): took {time.monotonic() - start:.1f} s")
    assert not failures, f"{len(failures)} of {CASES} cases ({outcomes}):\n" + "\n".join(failures[:40])
    assert outcomes["refused"] > CASES // 4 and outcomes["facts"] > 10, outcomes  # the fuzz reaches both outcomes
