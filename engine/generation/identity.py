"""Is speculative output the plain output? Decided with the numbers, not literally.

A verify batch computes a row's logits in a batch of several rows; plain
decoding computes them one row at a time. llama.cpp's kernels sum in another
order for another batch shape, so the two differ by numeric noise (measured
here: ~1e-3 on logits of scale ~10 for f32 tiny models, more for quantized
ones; llama.cpp users report the same, ggml-org/llama.cpp#25618). Wherever
plain greedy decoding's top two logits are closer than that noise, either
choice is "the" greedy token and outputs may part ways there.

So where plain and speculative outputs first differ, look at plain's top-2
margin at that token:

- inside the measured noise (``margin <= 2 * noise``: each of the two logits
  may move by the noise, in opposite directions): a **near tie** — both
  outputs are correct greedy decodes;
- outside it: a **defect** — the speculative loop changed the output, which
  must never happen.

``noise`` comes from :func:`measure_noise` on the loaded model (the largest
difference between a batched row's logits and the same row decoded alone).

Mixture-of-experts targets break the "logits move by the noise" premise: a
router whose top-k experts are near a tie (gap ~1e-4) picks another expert
when a batch shape nudges its input, and the logits then jump by whole units
(measured on the bench glm4moe model: 1.3–5.7). A single window of spread
tokens rarely hits such a router tie, so :func:`classify_along` measures the
noise again, along the prompt and output that parted, before it calls a
parting a defect.

Quantized kernels that switch paths by batch size (K-quants on x86 take
another one from 4 rows on) write the KV cache and recurrent state with other
rounding, and the difference builds up along the text: no window that starts
from a shared prefix sees it. So the last check replays plain's own tokens
in verify-sized batches, with no drafter at all (:func:`measure_noise_replay`):
where the target itself then produces the speculative run's token at the
parting row, the parting is the target's arithmetic, a near tie.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from engine.generation.session import Session

IDENTICAL, NEAR_TIE, DEFECT = "identical", "near_tie", "defect"
TIE_FACTOR = 2.0  # both top logits can move by the noise, in opposite directions


@dataclass(frozen=True)
class IdentityVerdict:
    kind: str  # identical | near_tie | defect
    index: int | None = None  # first token where the outputs differ
    margin: float | None = None  # plain's top-2 logit margin at that token
    noise: float = 0.0  # measured batch-vs-single logit difference

    @property
    def acceptable(self) -> bool:
        """Identical, or parted at a near tie: both are correct greedy outputs."""
        return self.kind != DEFECT

    def describe(self) -> str:
        if self.kind == IDENTICAL:
            return "identical to plain decoding"
        where = f"token {self.index}: plain's top-2 margin {self.margin:.2g}, numeric noise {self.noise:.2g}"
        if self.kind == NEAR_TIE:
            return f"differs from plain decoding at a near tie ({where}); both are correct greedy outputs"
        return f"DIFFERS from plain decoding beyond numeric noise ({where})"


def classify(plain_tokens: list[int], plain_margins: list[float], spec_tokens: list[int],
             noise: float) -> IdentityVerdict:
    """Compare a speculative output with the plain one.

    ``plain_margins``: the plain run's ``GenerateResult.margins`` (one per
    token, plus one for an end-of-generation token that ended it). A
    difference where plain's margin is unknown is a defect.
    """
    if plain_tokens == spec_tokens:
        return IdentityVerdict(IDENTICAL, noise=noise)
    n = min(len(plain_tokens), len(spec_tokens))
    index = next((i for i in range(n) if plain_tokens[i] != spec_tokens[i]), n)
    margin = plain_margins[index] if index < len(plain_margins) else None
    if margin is not None and margin <= TIE_FACTOR * noise:
        return IdentityVerdict(NEAR_TIE, index, margin, noise)
    return IdentityVerdict(DEFECT, index, margin, noise)


def measure_noise(session: Session, tokens: list[int] | None = None, rows: int = 9) -> float:
    """Largest |logit difference| between rows decoded in one batch and one at a time.

    Runs on the target context the way a verify does (``rows`` rows, every
    one an output, after a prefix) and leaves the context empty. The prefix
    and rows are ``tokens`` (default: a fixed spread of token ids).
    """
    from engine.runtime import Batch

    session.prepare(mtp=False)  # may recreate the target context: read it after
    target = session.target
    n_vocab = session.model.n_vocab
    rows = min(rows, target.params.n_outputs_max or rows)
    if tokens is None or len(tokens) < rows + 1:
        tokens = [(7 + 37 * i) % n_vocab for i in range(rows + 8)]
    prefix, tail = tokens[:-rows], tokens[-rows:]
    batch = Batch(max(target.n_batch, rows))

    def prefill() -> None:  # in chunks of the context's batch (one larger decode aborts the process)
        target.clear()
        for start in range(0, len(prefix), target.n_batch):
            batch.clear()
            for k, tok in enumerate(prefix[start:start + target.n_batch], start):
                batch.add(tok, k, k == len(prefix) - 1)
            target.decode(batch)

    def logits(row: int) -> np.ndarray:
        return np.ctypeslib.as_array(target.logits(row), shape=(n_vocab,)).copy()

    prefill()
    batch.clear()
    for k, tok in enumerate(tail):
        batch.add(tok, len(prefix) + k, True)
    target.decode(batch)
    together = [logits(k) for k in range(rows)]
    prefill()
    alone = []
    for k, tok in enumerate(tail):
        batch.clear()
        batch.add(tok, len(prefix) + k, True)
        target.decode(batch)
        alone.append(logits(0))
    target.clear()
    return float(max(np.abs(a - b).max() for a, b in zip(together, alone, strict=True)))


def measure_noise_along(session: Session, tokens: list[int], start: int, rows: int = 9) -> float:
    """:func:`measure_noise` over consecutive windows of ``rows`` rows covering ``tokens[start:]``.

    The positions a generation decoded, with its own tokens: on a MoE target
    that is where a router near-tie shows up (see the module docstring).
    """
    rows = max(1, min(rows, session.target.params.n_outputs_max or rows))
    first = max(start + rows, rows + 1)  # measure_noise needs a prefix of at least one token
    ends = list(range(first, len(tokens) + 1, rows))
    if len(tokens) >= rows + 1 and (not ends or ends[-1] != len(tokens)):  # the last (or only) window, overlapping
        ends.append(len(tokens))
    return max((measure_noise(session, tokens[:end], rows) for end in ends), default=0.0)


def classify_along(session: Session, prompt_tokens: list[int], plain_tokens: list[int], plain_margins: list[float],
                   spec_tokens: list[int], noise: float, rows: int = 9) -> IdentityVerdict:
    """:func:`classify`, but a defect is checked once more with the noise measured where it parted.

    Measured along the rows that produced plain's tokens up to the parting
    (prompt's last token on), and with the parting row as row 0 of batches of
    2..``rows`` rows, as a verify batch holds it (its logits depend on the
    batch's shape, not on the later rows' tokens).
    """
    verdict = classify(plain_tokens, plain_margins, spec_tokens, noise)
    if verdict.kind != DEFECT or verdict.index is None or not prompt_tokens:
        return verdict
    full = [*prompt_tokens, *plain_tokens]
    row0 = len(prompt_tokens) - 1 + verdict.index  # position of the row that produced the parting token
    along = measure_noise_along(session, full[:row0], len(prompt_tokens) - 1, rows)
    at = [measure_noise(session, full[:row0 + k], k) for k in range(2, rows + 1) if row0 + k <= len(full)]
    verdict = classify(plain_tokens, plain_margins, spec_tokens, max(noise, along, *at))
    if verdict.kind != DEFECT or verdict.index is None:
        return verdict
    if verdict.index >= len(spec_tokens):
        return verdict  # the speculative output ended early: no token of its own to reproduce
    replay = measure_noise_replay(session, prompt_tokens, plain_tokens, verdict.index, spec_tokens[verdict.index],
                                  rows)
    return classify(plain_tokens, plain_margins, spec_tokens, max(verdict.noise, replay))


def measure_noise_replay(session: Session, prompt_tokens: list[int], plain_tokens: list[int], index: int,
                         token: int, rows: int = 9) -> float:
    """How far the row that produced ``plain_tokens[index]`` moves when plain's own tokens are
    decoded in batches of 2..``rows`` rows instead of one at a time — counted only for batch
    shapes under which that row's greedy token becomes ``token`` (the speculative run's), else 0.

    No drafter and no rollback take part: the same tokens at the same
    positions, only the batch shapes of a verify. Every row a batch computes
    writes the KV cache (and a recurrent target's state) with that shape's
    rounding, so differences build up along the text; the row-by-row windows
    above start each window from the same prefix and cannot see that.
    Measured on a Q4_K_M model, whose CPU kernels take another path from 4
    rows on: logits identical for 26 tokens, then apart by 0.12-0.37 for
    every later row (docs/mtp.md, "Identity"). A drifting state of the
    loop's own making (a rollback slightly off) shows the same drift, so a
    drift alone excuses nothing: the target, fed plain's tokens, must itself
    produce the speculative token there.
    """
    from engine.runtime import Batch

    rows = max(2, min(rows, session.target.params.n_outputs_max or rows))
    if index < 1:
        return 0.0  # the first token comes from the prompt's last row: no batch shape of ours touched it
    session.prepare(mtp=False)
    target = session.target
    n_vocab = session.model.n_vocab
    fed = plain_tokens[:index]  # tokens whose rows lead up to the parting row, which is the last
    batch = Batch(max(target.n_batch, rows))

    def last_row(chunk: int) -> np.ndarray:
        target.clear()
        for start in range(0, len(prompt_tokens), target.n_batch):
            part = prompt_tokens[start:start + target.n_batch]
            batch.clear()
            for k, tok in enumerate(part):
                batch.add(tok, start + k, False)
            target.decode(batch)
        pos = len(prompt_tokens)
        for start in range(0, len(fed), chunk):
            part = fed[start:start + chunk]
            batch.clear()
            for k, tok in enumerate(part):
                batch.add(tok, pos + k, True)
            target.decode(batch)
            pos += len(part)
        return np.ctypeslib.as_array(target.logits(batch.n - 1), shape=(n_vocab,)).copy()

    alone = last_row(1)
    moved = 0.0
    for k in range(2, rows + 1):
        batched = last_row(k)
        if int(batched.argmax()) == token:
            moved = max(moved, float(np.abs(batched - alone).max()))
    target.clear()
    return moved
