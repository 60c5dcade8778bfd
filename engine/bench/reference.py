"""Ours vs llama.cpp's own MTP driver (``llama-speculative-simple``), on the
same GGUF and prompt, built from the same pinned sdist
(``packaging/build_reference_driver.py``).

Both loops start the same way (prefill all but the last prompt token, draft
from it), so the rounds can be compared one by one: where each starts, what
was drafted, how much was accepted, and the target's token after it. Speed is
compared as decode tok/s, interleaved over several repeats.

The driver's verbose log (``-v``) is the only window into its rounds; the
lines read here are ``common/speculative.cpp``'s draft candidates and
``examples/speculative-simple``'s "accepted" and "partial acceptance" lines.
"""

from __future__ import annotations

import re
import statistics
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from engine.generation.generator import GenerateRequest, generate
from engine.generation.session import Session
from engine.speculative.settings import SpeculativeSettings

_EVENT = re.compile(
    r"draft candidate\s+0, pos\s+(?P<step>\d+):\s+(?P<token>-?\d+)"
    r"|partial acceptance: (?P<p_acc>\d+) < (?P<p_drafted>\d+)"
    r"|accepted (?P<acc>\d+)/(?P<drafted>\d+) draft tokens, the last target token is: \((?P<last>-?\d+)\)"
)
_SPEED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds")
_DRAFTED = re.compile(r"n_drafted\s*=\s*(\d+)")
_ACCEPT = re.compile(r"n_accept\s*=\s*(\d+)")


@dataclass(frozen=True)
class Round:
    """One verify that checked a fresh draft.

    ``pos`` is where ``id_last`` sits, counted from the held last prompt token
    (0); ``last`` is the target's token after the accepted drafts (None where
    the log does not say: a partial round the driver then replays, or our
    reply ending at an end-of-generation token).
    """

    pos: int
    accepted: int
    drafted: int
    drafts: tuple[int, ...]
    last: int | None
    # ours only: each draft's top-1 minus top-2 logit in the head (how near a tie it was)
    margins: tuple[float, ...] = field(default=(), compare=False)

    @property
    def counts(self) -> tuple[int, int]:
        return self.accepted, self.drafted


@dataclass
class DriverRun:
    rounds: list[Round]  # fresh drafts the driver verified within its token budget
    unbudgeted: list[Round]  # drafted with no budget left (see parse_rounds)
    replays: int  # checkpoint replays: accepted tokens re-verified as a "draft"
    n_drafted: int
    n_accept: int
    tokens: int
    seconds: float

    @property
    def tps(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


@dataclass
class OursRun:
    rounds: list[Round]
    tokens: list[int]
    tps: float


def parse_rounds(log: str, n_predict: int) -> tuple[list[Round], list[Round], int]:
    """The driver's rounds from its verbose log: (budgeted, unbudgeted, replays).

    - Drafts: the ``draft candidate 0`` line of each step of a draft call (the
      top candidate is the drafted token; with ``p_min`` 0 nothing stops a
      draft early), cut to the verified length.
    - A round that accepts only part of its draft on a target that cannot
      remove a partial sequence (qwen3next) is logged as "partial acceptance";
      the driver then restores a checkpoint and verifies the accepted tokens
      plus the bonus token again as a "draft" of their own (a *replay*: no
      draft call before it). Replays are counted, not returned as rounds.
    - *Unbudgeted*: when the token budget is used up (``n_predict - predicted
      - 1 <= 0``) the driver still drafts, and ``common_speculative_draft``
      skips its truncation because it only truncates for ``n_max > 0``: a
      full-depth draft past the end of the reply. Our loop does not draft
      there. Such rounds are returned apart.
    """
    rounds: list[Round] = []
    unbudgeted: list[Round] = []
    replays = 0
    pos = 0
    predicted = 0
    candidates: list[int] = []
    fresh = False  # a draft call ran since the last verify

    def keep(accepted: int, drafted: int, last: int | None) -> None:
        r = Round(pos, accepted, drafted, tuple(candidates[:drafted]), last)
        (rounds if n_predict - predicted - 1 > 0 else unbudgeted).append(r)

    for m in _EVENT.finditer(log):
        if m.group("token") is not None:
            if int(m.group("step")) == 0:
                candidates = []
            candidates.append(int(m.group("token")))
            fresh = True
        elif m.group("p_acc") is not None:  # state restored: the position does not advance
            if fresh:
                keep(int(m.group("p_acc")), int(m.group("p_drafted")), None)
            fresh = False
        else:
            accepted, drafted = int(m.group("acc")), int(m.group("drafted"))
            if drafted > 0 and fresh:
                keep(accepted, drafted, int(m.group("last")))
            elif drafted > 0:
                replays += 1
            pos += accepted + 1
            predicted += accepted + 1
            fresh = False
    return rounds, unbudgeted, replays


def driver_command(binary: Path, model: Path, prompt: str, n_tokens: int, n_max: int, threads: int,
                   sidecar: Path | None = None, n_ctx: int = 2048, verbose: bool = True) -> list[str]:
    cmd = [str(binary), "-m", str(model), "--spec-type", "draft-mtp", "--spec-draft-n-max", str(n_max),
           "-p", prompt, "-n", str(n_tokens), "--temp", "0", "-t", str(threads), "-tb", str(threads),
           "-c", str(n_ctx)]
    if verbose:
        cmd.append("-v")
    if sidecar is not None:  # an MTP-only GGUF beside a trunk: loaded as the MTP context's model
        cmd += ["--spec-draft-model", str(sidecar)]
    return cmd


def run_driver(binary: Path, model: Path, prompt: str, n_tokens: int, n_max: int, threads: int,
               sidecar: Path | None = None, n_ctx: int = 2048, verbose: bool = True, tries: int = 20) -> DriverRun:
    """One run of the driver; ``verbose`` logs every round (and costs it time:
    the log lines are formatted on its decoding thread), so speed is measured
    without it.

    The driver's logger is asynchronous and never flushed at exit
    (``common/log.cpp``: "logs may be lost if not flushed before the program
    exits"), so now and then a log ends early; the queue is in order, so a
    log that reaches the summary is complete, and a cut one is run again. The
    busier the machine, the more often its logging thread falls behind the
    exit (5 tries were all cut at once on a 2-core machine running the test
    suite beside two other jobs): a tiny model's run takes a fraction of a
    second, so 20 tries cost little.
    """
    cmd = driver_command(binary, model, prompt, n_tokens, n_max, threads, sidecar, n_ctx, verbose)
    for _ in range(tries):
        proc = subprocess.run(cmd, capture_output=True, timeout=600)
        # token pieces in the log are raw bytes of a synthetic vocabulary: never let them stop the parse
        log = proc.stderr.decode("utf-8", "replace")
        if proc.returncode != 0:
            raise RuntimeError(f"{binary.name} failed ({proc.returncode}): {log[-800:]}")
        speed = _SPEED.search(log)
        drafted, accepted = _DRAFTED.search(log), _ACCEPT.search(log)
        if speed and drafted and accepted:
            break
    else:
        raise RuntimeError(f"{binary.name}'s log ended before its summary {tries} times: {log[-800:]}")
    rounds, unbudgeted, replays = parse_rounds(log, n_tokens)
    return DriverRun(rounds, unbudgeted, replays, int(drafted.group(1)), int(accepted.group(1)),
                     int(speed.group(1)), float(speed.group(2)))


def run_ours(session: Session, prompt: str, n_tokens: int, n_max: int) -> OursRun:
    """Our loop, started as the driver starts (``hold_last_prompt_token``).

    Positions are counted from the accepted lengths: with ``p_min`` and
    ``n_min`` 0 every step that has room drafts, so no plain step sits
    between two rounds.
    """
    result = generate(session, GenerateRequest(
        prompt=prompt, max_tokens=n_tokens, hold_last_prompt_token=True, record_drafts=True,
        speculative=SpeculativeSettings(mode="mtp", n_max=n_max)))
    s = result.stats
    seconds = (s.t_end or 0.0) - (s.t_first_token or 0.0)
    rounds: list[Round] = []
    pos = 0
    margins = result.draft_margins_per_round or [()] * len(result.drafts_per_round)
    for accepted, drafted, drafts, margin in zip(result.accepted_per_round, result.drafted_per_round,
                                                 result.drafts_per_round, margins, strict=True):
        # result.tokens[i] sits at position i + 1 (the held prompt token is at 0)
        k = pos + accepted
        rounds.append(Round(pos, accepted, drafted, tuple(drafts),
                            result.tokens[k] if k < len(result.tokens) else None, tuple(margin)))
        pos += accepted + 1
    return OursRun(rounds, list(result.tokens), s.generated_tokens / seconds if seconds > 0 else 0.0)


# Top-1 minus top-2 logit below which two programs may draft either token: batch shapes move a
# logit by ~1e-3 here (measured: 0.0024 between tokens 9 and 36 of the random step35 head on an
# AVX-512 Xeon, where ours drafted one and llama.cpp's driver the other)
TIE_LOGIT = 0.01


def round_differences(ours: Sequence[Round], theirs: DriverRun) -> list[str]:
    """Where our rounds differ from the driver's; empty when they agree.

    Without replays the two loops visit the same positions, so the round
    lists must be equal as a whole: position, counts, drafted tokens and the
    target's next token (``last`` is compared where both logs give it). With
    replays (qwen3next) the driver verifies one more target token after every
    partial round before it drafts again, so the loops draft at different
    positions; the rounds both make at the same position must still be equal.
    """
    diffs: list[str] = []

    def same(a: Round, b: Round) -> bool:
        last_ok = a.last is None or b.last is None or a.last == b.last
        if (a.pos, a.accepted, a.drafted) != (b.pos, b.accepted, b.drafted) or not last_ok:
            return False
        if a.drafts == b.drafts:
            return True
        # a draft may differ where our head was at a numeric tie between two tokens (the two programs
        # decode the draft rows in batches of other shapes, whose sums round differently) and only past
        # what the target accepted, so nothing else of the round can differ
        k = next(i for i, (x, y) in enumerate(zip(a.drafts, b.drafts, strict=True)) if x != y)
        return k >= a.accepted and k < len(a.margins) and a.margins[k] < TIE_LOGIT

    if theirs.replays == 0:
        for i in range(max(len(ours), len(theirs.rounds))):
            a = ours[i] if i < len(ours) else None
            b = theirs.rounds[i] if i < len(theirs.rounds) else None
            if a is None or b is None or not same(a, b):
                diffs.append(f"round {i}: ours {a}, llama.cpp {b}")
        return diffs
    mine = {r.pos: r for r in ours}
    for i, b in enumerate(theirs.rounds):
        a = mine.get(b.pos)
        if a is not None and not same(a, b):
            diffs.append(f"llama.cpp round {i} at position {b.pos}: ours {a}, llama.cpp {b}")
    return diffs


def common_positions(ours: Sequence[Round], theirs: DriverRun) -> int:
    """How many of the driver's rounds start where one of ours starts."""
    mine = {r.pos for r in ours}
    return sum(1 for r in theirs.rounds if r.pos in mine)


@dataclass
class Comparison:
    ours: list[float] = field(default_factory=list)
    theirs: list[float] = field(default_factory=list)
    ours_run: OursRun | None = None
    theirs_run: DriverRun | None = None

    @property
    def ratio(self) -> float:
        ratios = [a / b for a, b in zip(self.ours, self.theirs, strict=False) if b]
        return statistics.median(ratios) if ratios else 0.0

    def differences(self) -> list[str]:
        if self.ours_run is None or self.theirs_run is None:
            return ["nothing was run"]
        return round_differences(self.ours_run.rounds, self.theirs_run)


def compare(session: Session, binary: Path, model: Path, prompt: str, n_tokens: int, n_max: int,
            repeats: int, threads: int, sidecar: Path | None = None) -> Comparison:
    """Speed of both, interleaved over ``repeats``, the driver without its
    verbose log; then one verbose driver run for the rounds."""
    comp = Comparison()
    n_ctx = session.options.n_ctx
    run_ours(session, prompt, 16, n_max)  # warm-up
    for rep in range(repeats):
        order = ("ours", "theirs") if rep % 2 == 0 else ("theirs", "ours")
        for who in order:
            if who == "ours":
                mine = run_ours(session, prompt, n_tokens, n_max)
                comp.ours.append(mine.tps)
                comp.ours_run = mine
            else:
                run = run_driver(binary, model, prompt, n_tokens, n_max, threads, sidecar, n_ctx, verbose=False)
                comp.theirs.append(run.tps)
    comp.theirs_run = run_driver(binary, model, prompt, n_tokens, n_max, threads, sidecar, n_ctx)
    return comp
