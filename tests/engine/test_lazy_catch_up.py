"""A lazy head under adaptive depth (engine/speculative/mtp.py, ``catches_up_lazily``).

Adaptive depth may draft nothing for long stretches (a CPU with a real vocabulary, a compute-bound
batch). Its head keeps the rows it was not caught up on, hidden states included, and decodes only the
newest ``LAZY_WINDOW`` of them when it drafts again; a head that drafts nothing decodes nothing. After
such a gap the drafts are checked against an exactly caught-up head's (an oracle head reading the hidden
state drafts from its last row, so a wrong ``pending_h`` shows), and every row the lazy head decodes
against the rows the exact head decodes, position, token and hidden state (a window decoded with the
wrong states or at the wrong positions shows there, which an oracle head's drafts would not); the output
against speculation off.
"""

from __future__ import annotations

import ctypes

import pytest

from engine.generation.generator import GenerateRequest, generate
from engine.generation.parallel import generate_together
from engine.generation.session import LoadOptions, Session
from engine.speculative import mtp as mtp_module
from engine.speculative import reuse
from engine.speculative.adaptive import AdaptiveDepth, AdaptiveParams, Costs
from engine.speculative.settings import ADAPTIVE, SPECULATION_OFF, mtp
from engine.synth.spec import ARCHITECTURES
from tests.engine.conftest import synth

ADAPTIVE_MTP = mtp(3, depth=ADAPTIVE)
LONG_PROMPT = " the river model" * 20  # more rows than the window: the head drops some


class Schedule:
    """A depth policy that drafts ``n`` tokens in the rounds ``drafting`` says, plain steps otherwise."""

    shadow_probe = False

    def __init__(self, n: int, drafting) -> None:
        self.n, self.drafting, self.depth, self.round = n, drafting, None, 0

    def new_reply(self, shadow_probes: bool = False) -> None:
        self.round, self.depth = 0, None

    def choose(self, room: int) -> int:
        self.round += 1
        self.depth = min(self.n, room) if self.drafting(self.round) else 0
        return self.depth

    def observe(self, *args, **kwargs) -> None:
        pass


def never_pays() -> AdaptiveDepth:
    """Adaptive depth on given costs where a draft step costs five plain steps, probing only every 64."""
    params = AdaptiveParams(probe_first=64, probe_max=64)
    return AdaptiveDepth(3, params, Costs.given({k: 1.0 for k in range(1, 6)}, draft_step_s=5.0, params=params))


def count_rows(ctx, monkeypatch, rows: set | None = None) -> list[int]:
    """[decodes, rows] of ``ctx`` from now on; each row's (position, token, hidden-state row) into ``rows``."""
    counts = [0, 0]
    decode = ctx.decode

    def counting(batch):
        counts[0] += 1
        counts[1] += batch.n
        if rows is not None:
            width = 4 * batch.n_embd
            embd = ctypes.string_at(batch.embd_row_address(0), batch.n * width)
            rows.update((batch.pos[i], batch.tokens[i], embd[i * width:(i + 1) * width]) for i in range(batch.n))
        decode(batch)

    monkeypatch.setattr(ctx, "decode", counting)
    return counts


def exact(monkeypatch) -> None:
    """Catch up on every row, as a fixed depth does (the reference)."""
    for module in (mtp_module, reuse):
        monkeypatch.setattr(module, "catches_up_lazily", lambda settings: False)


def test_a_head_that_drafts_nothing_decodes_nothing_across_turns(monkeypatch):
    path = str(synth("glm4moe", "oracle", agree=0.8, reads="hidden").path())
    with Session(LoadOptions(path=path, n_ctx=1024)) as session:
        plain = generate(session, GenerateRequest(prompt=LONG_PROMPT, max_tokens=40, speculative=SPECULATION_OFF))
        counts = count_rows(session.mtp_drafter.ctx, monkeypatch)
        policy = never_pays()
        first = generate(session, GenerateRequest(prompt=LONG_PROMPT, max_tokens=40, speculative=ADAPTIVE_MTP),
                         policy=policy)
        assert first.tokens == plain.tokens
        assert first.stats.rounds == 0 and counts == [0, 0]  # no draft, no catch-up of prompt or reply
        follow = LONG_PROMPT + first.text + " and then"
        again = generate(session, GenerateRequest(prompt=follow, max_tokens=40, speculative=ADAPTIVE_MTP),
                         policy=policy)
        # the next turn reuses the rows the target holds (the reply's text tokenizes otherwise here),
        # though the head holds none of them
        assert again.stats.prompt_reused >= first.stats.prompt_tokens
        assert counts == [0, 0]
    with Session(LoadOptions(path=path, n_ctx=1024)) as session:
        alone = generate(session, GenerateRequest(prompt=follow, max_tokens=40, speculative=SPECULATION_OFF))
    assert again.tokens == alone.tokens


def test_sequences_that_draft_nothing_decode_nothing_on_the_head(monkeypatch):
    path = str(synth("glm4moe", "oracle", agree=0.8, reads="hidden").path())
    requests = [GenerateRequest(prompt=p, max_tokens=1, speculative=ADAPTIVE_MTP)
                for p in (LONG_PROMPT, " a quiet light", " numbers and words")]
    with Session(LoadOptions(path=path, n_ctx=1024, parallel=3)) as session:
        counts = count_rows(session.mtp_drafter.ctx, monkeypatch)
        results = generate_together(session, requests)
        assert counts == [0, 0]  # the prompts' rows wait for a draft that never comes
        assert all(len(r.tokens) == 1 for r in results)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_drafts_after_dropped_rows_are_those_of_an_exact_head(arch, monkeypatch):
    """Drafts in the first rounds (after a prompt longer than the window), then 90 plain steps (the
    backlog is cut to the window), then drafts again; then a second turn reusing the first. An oracle
    head drafts from its last row alone, so the drafts must be the exact head's; and every row the lazy
    head decodes must be one the exact head decodes, with the same position, token and hidden state."""
    path = str(synth(arch, "oracle", agree=0.7, reads="hidden").path())

    def drafting(rnd: int) -> bool:
        return rnd <= 5 or rnd > 95

    def run(rows: set) -> tuple[list, int]:
        with Session(LoadOptions(path=path, n_ctx=1024)) as session:
            counts = count_rows(session.mtp_drafter.ctx, monkeypatch, rows)
            out = []
            prompt = LONG_PROMPT
            for _ in range(2):
                r = generate(session, GenerateRequest(prompt=prompt, max_tokens=130, speculative=ADAPTIVE_MTP,
                                                      record_drafts=True), policy=Schedule(3, drafting))
                out.append((r.tokens, r.drafts_per_round, r.stats.prompt_reused))
                prompt = prompt + r.text + " and more"
            return out, counts[1]

    lazy_decoded, full_decoded = set(), set()
    lazy, lazy_rows = run(lazy_decoded)
    exact(monkeypatch)
    full, full_rows = run(full_decoded)
    assert [t for t, _, _ in lazy] == [t for t, _, _ in full]
    assert [d for _, d, _ in lazy] == [d for _, d, _ in full]  # every draft, round by round
    assert any(d for _, d, _ in lazy)
    assert lazy_rows < full_rows - 100, (lazy_rows, full_rows)
    assert lazy_decoded <= full_decoded, sorted((p, t) for p, t, _ in lazy_decoded - full_decoded)[:8]


@pytest.mark.parametrize("drafting_at_the_end", [True, False])
def test_a_lazy_head_drafting_as_its_reply_ends_keeps_every_row(drafting_at_the_end):
    """A head drafting as the reply ends decodes its last round's rows then, so the next turn reuses every
    row on both contexts (as a fixed depth does); one that stopped drafting leaves its backlog undecoded."""
    path = str(synth("glm4moe", "oracle", agree=0.8, reads="hidden").path())
    policy = Schedule(3, (lambda rnd: True) if drafting_at_the_end else (lambda rnd: rnd <= 3))
    with Session(LoadOptions(path=path, n_ctx=1024)) as session:
        generate(session, GenerateRequest(prompt=" the river model", max_tokens=40, speculative=ADAPTIVE_MTP),
                 policy=policy)
        held, head = session.prefix.tokens, session.prefix.mtp_tokens
        assert held
        if drafting_at_the_end:
            assert head == held
        else:
            assert len(head) < len(held) - 20


def test_a_shadow_probe_decodes_its_own_row_alone(monkeypatch):
    """A shadow probe is never verified: the lazy head drafts it from its own row and drops what waits (on a
    mixture of experts each waiting row costs about a drafted row's decode)."""
    path = str(synth("glm4moe", "oracle", agree=0.8, reads="hidden").path())
    params = AdaptiveParams(probe_first=8, probe_max=8)
    policy = AdaptiveDepth(3, params, Costs.given({k: 1.0 for k in range(1, 6)}, draft_step_s=5.0, params=params))
    with Session(LoadOptions(path=path, n_ctx=1024)) as session:
        plain = generate(session, GenerateRequest(prompt=LONG_PROMPT, max_tokens=40, speculative=SPECULATION_OFF))
        counts = count_rows(session.mtp_drafter.ctx, monkeypatch)
        probed = generate(session, GenerateRequest(prompt=LONG_PROMPT, max_tokens=40, speculative=ADAPTIVE_MTP),
                          policy=policy)
    assert probed.tokens == plain.tokens and probed.stats.rounds == 0
    assert counts[0] >= 3 and counts[1] == counts[0]  # probes, one row each
