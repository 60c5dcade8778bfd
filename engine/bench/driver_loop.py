"""llama.cpp's ``speculative-simple`` loop, re-run in Python on our MTP drafter.

Why: on a target that cannot remove part of a sequence (qwen3next: recurrent
layers without per-token snapshots) the C++ driver takes a checkpoint before
each verify, and after a partial acceptance restores it and verifies the
accepted tokens plus the bonus token again as a "draft" of their own (a
replay). It drafts at other positions than our loop, so its rounds cannot be
compared with ours one for one. And its MTP driver does not restore its
``pending_h`` with the checkpoint: the replay's first row is paired with the
hidden state of the rejected verify's last row instead of the one before
``id_last`` (``common/speculative.cpp``, ``process``: ``pending_h`` is set from
every processed batch; ``accept``, which re-anchors it, is skipped on the
partial path of ``examples/speculative-simple``). Its later drafts attend to
that wrong MTP KV cell.

This module re-runs the driver's control flow (checkpoint, replay, token
budget) on our drafter, so the C++ driver can be checked one for one against
it (``restore_pending_h=False`` reproduces the driver as built), and our own
loop against it with the hidden state restored (``True``) wherever both draft
at the same position. It is a test instrument, not a decoding path.
"""

from __future__ import annotations

from engine.bench.reference import Round
from engine.generation.session import Session
from engine.runtime import Batch, Sampler, SamplingParams
from engine.speculative.settings import SpeculativeSettings

PARTIAL_ONLY = 1  # LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY, as the driver saves its checkpoints


def driver_rounds(session: Session, prompt: str, n_tokens: int, n_max: int,
                  restore_pending_h: bool) -> tuple[list[Round], list[Round]]:
    """(budgeted, unbudgeted) rounds of the driver's loop, positions counted
    from the held last prompt token as in :func:`engine.bench.reference.parse_rounds`.

    ``session`` must be opened with ``fold=False``: the driver catches the MTP
    context up on every verify batch at once.
    """
    drafter = session.mtp_drafter
    assert drafter is not None and not drafter.fold, "needs an MTP session opened with fold=False"
    session.prepare(mtp=True)
    target, model = session.target, session.model
    drafter.begin(SpeculativeSettings(mode="mtp", n_max=n_max))
    tokens = model.tokenize(prompt, add_special=True, parse_special=True)
    batch = Batch(max(target.params.n_batch, n_max + 2))
    target.clear()
    prefill = tokens[:-1]
    for k, tok in enumerate(prefill):  # the driver asks for no output row here
        batch.add(tok, k, False)
    target.decode(batch)
    drafter.process(prefill, 0)
    sampler = Sampler(SamplingParams())
    start = pos = len(prefill)
    id_last, predicted = tokens[-1], 0
    budgeted: list[Round] = []
    unbudgeted: list[Round] = []

    def verify(ids: list[int]) -> None:
        batch.clear()
        for k, tok in enumerate(ids):
            batch.add(tok, pos + k, True)
        target.decode(batch)
        drafter.verified(ids, pos)

    def sample_and_accept(draft: list[int]) -> list[int]:
        # common_sampler_sample_and_accept_n (greedy; no EOG occurs in these runs)
        out: list[int] = []
        for k in range(len(draft) + 1):
            out.append(sampler.sample(target.handle, k))
            if k == len(draft) or out[-1] != draft[k]:
                break
        return out

    try:
        while predicted <= n_tokens:
            budget = n_tokens - predicted - 1
            # at a budget of 0 the driver's draft is not truncated (common_speculative_draft)
            draft = drafter.draft(id_last, pos, min(n_max, budget) if budget > 0 else n_max)
            saved = target.state_save(flags=PARTIAL_ONLY)
            pending = drafter.pending_h.copy()
            verify([id_last, *draft])
            ids = sample_and_accept(draft)
            if draft:
                r = Round(pos - start, len(ids) - 1, len(draft), tuple(draft),
                          ids[-1] if len(ids) - 1 == len(draft) else None)
                (budgeted if budget > 0 else unbudgeted).append(r)
            if len(ids) - 1 < len(draft):  # partial: restore, then replay the accepted tokens and the bonus
                target.state_restore(saved, flags=PARTIAL_ONLY)
                target.seq_rm(pos, -1)
                drafter.ctx.seq_rm(pos, -1)
                if restore_pending_h:
                    drafter.pending_h[:] = pending
                replay = ids
                verify([id_last, *replay])
                ids = sample_and_accept(replay)
            drafter.accept(len(ids) - 1, pos)
            pos += len(ids)
            predicted += len(ids)
            target.seq_rm(pos, -1)
            drafter.ctx.seq_rm(pos, -1)
            id_last = ids[-1]
    finally:
        sampler.close()
    return budgeted, unbudgeted
