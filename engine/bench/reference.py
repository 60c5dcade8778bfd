"""Ours vs llama.cpp's own MTP driver (``llama-speculative-simple``), on the
same GGUF and prompt, built from the same pinned sdist
(``packaging/build_reference_driver.py``).

Both loops start the same way (prefill all but the last prompt token, draft
from it), so drafted/accepted counts can be compared round by round; speed is
compared as decode tok/s, interleaved over several repeats.
"""

from __future__ import annotations

import re
import statistics
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from engine.generation.generator import GenerateRequest, generate
from engine.generation.session import Session
from engine.speculative.drafter import SpeculativeParams

_ROUND = re.compile(r"accepted (\d+)/(\d+) draft tokens")
_SPEED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds")
_DRAFTED = re.compile(r"n_drafted\s*=\s*(\d+)")
_ACCEPT = re.compile(r"n_accept\s*=\s*(\d+)")


@dataclass
class DriverRun:
    rounds: list[tuple[int, int]]  # (accepted, drafted) per verify
    n_drafted: int
    n_accept: int
    tokens: int
    seconds: float

    @property
    def tps(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


@dataclass
class Comparison:
    ours: list[float] = field(default_factory=list)
    theirs: list[float] = field(default_factory=list)
    ours_rounds: list[tuple[int, int]] = field(default_factory=list)
    theirs_rounds: list[tuple[int, int]] = field(default_factory=list)

    @property
    def ratio(self) -> float:
        ratios = [a / b for a, b in zip(self.ours, self.theirs, strict=False) if b]
        return statistics.median(ratios) if ratios else 0.0

    def rounds_equal(self) -> tuple[bool, int]:
        """Do the per-round counts agree? The last round may differ: the two
        loops cap the final draft by the token budget slightly differently."""
        n = min(len(self.ours_rounds), len(self.theirs_rounds)) - 1
        return self.ours_rounds[:n] == self.theirs_rounds[:n], n


def run_driver(binary: Path, model: Path, prompt: str, n_tokens: int, n_max: int, threads: int) -> DriverRun:
    cmd = [str(binary), "-m", str(model), "--spec-type", "draft-mtp", "--spec-draft-n-max", str(n_max),
           "-p", prompt, "-n", str(n_tokens), "--temp", "0", "-t", str(threads), "-tb", str(threads),
           "-c", "2048", "-v"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    log = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise RuntimeError(f"{binary.name} failed ({proc.returncode}): {log[-800:]}")
    speed = _SPEED.search(log)
    drafted, accepted = _DRAFTED.search(log), _ACCEPT.search(log)
    if not (speed and drafted and accepted):
        raise RuntimeError(f"could not read {binary.name}'s summary: {log[-800:]}")
    rounds = [(int(a), int(d)) for a, d in _ROUND.findall(log) if int(d) > 0]
    return DriverRun(rounds, int(drafted.group(1)), int(accepted.group(1)), int(speed.group(1)),
                     float(speed.group(2)))


def run_ours(session: Session, prompt: str, n_tokens: int, n_max: int) -> tuple[float, list[tuple[int, int]]]:
    result = generate(session, GenerateRequest(prompt=prompt, max_tokens=n_tokens, hold_last_prompt_token=True,
                                               speculative=SpeculativeParams("mtp", n_max)))
    s = result.stats
    seconds = (s.t_end or 0.0) - (s.t_first_token or 0.0)
    rounds = list(zip(result.accepted_per_round, result.drafted_per_round, strict=False))
    return (s.generated_tokens / seconds if seconds > 0 else 0.0), rounds


def compare(session: Session, binary: Path, model: Path, prompt: str, n_tokens: int, n_max: int,
            repeats: int, threads: int) -> Comparison:
    comp = Comparison()
    run_ours(session, prompt, 16, n_max)  # warm-up
    for rep in range(repeats):
        order = ("ours", "theirs") if rep % 2 == 0 else ("theirs", "ours")
        for who in order:
            if who == "ours":
                tps, rounds = run_ours(session, prompt, n_tokens, n_max)
                comp.ours.append(tps)
                comp.ours_rounds = rounds
            else:
                run = run_driver(binary, model, prompt, n_tokens, n_max, threads)
                comp.theirs.append(run.tps)
                comp.theirs_rounds = run.rounds
    return comp
