"""The doctor's live probe: draft a few short replies with the real pair and
count how many drafts the target accepts.

Why: a sidecar exported from another finetune of the same base model has the
same shapes, vocabulary and block layout, so every header check passes, yet
its drafts are almost never accepted (seen: 0 of 291). Only running the pair
tells. llama.cpp is loaded in a child process, never in the caller's (the CLI
or the app), as Repair's proof load does: a native abort must not take the
caller down.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from engine.errors import EngineError
from engine.gguf.sidecar import Finding

LOW_ACCEPTANCE = 0.05  # below this over MIN_DRAFTED drafted tokens, the head is not this model's
MIN_DRAFTED = 64

_CHILD = """
import json, sys
from engine.generation.generator import GenerateRequest, generate
from engine.generation.session import LoadOptions, Session
from engine.speculative.settings import SpeculativeSettings
target, sidecar, min_drafted = sys.argv[1], sys.argv[2] or None, int(sys.argv[3])
prompts = json.loads(sys.argv[4])
s = Session(LoadOptions(path=target, sidecar=sidecar, n_ctx=512))
rounds = drafted = accepted = 0
try:
    for prompt in prompts:
        r = generate(s, GenerateRequest(prompt=prompt, max_tokens=48,
                                        speculative=SpeculativeSettings("mtp", n_max=3, p_min=0.0)))
        rounds, drafted, accepted = rounds + r.stats.rounds, drafted + r.stats.drafted, accepted + r.stats.accepted
        if drafted >= min_drafted:
            break
    print("PROBE", json.dumps({"status": s.mtp_status, "rounds": rounds, "drafted": drafted, "accepted": accepted}))
finally:
    s.close()
"""

# Plain text any base model or finetune continues; several, so that a model that
# stops early (end of text) still drafts enough tokens.
PROMPTS = (
    "The history of the city begins",
    "Here is a short story about a river and a mill.",
    "def fibonacci(n):",
    "Water boils at a lower temperature at high altitude because",
    "the the the the",
)


class ProbeError(EngineError):
    kind = "probe"

    def __init__(self, message: str, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out


@dataclass(frozen=True)
class ProbeResult:
    status: str  # the session's MTP mode: single | chained | off
    rounds: int
    drafted: int
    accepted: int

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def rarely_accepted(self) -> bool:
        return self.drafted >= MIN_DRAFTED and self.acceptance < LOW_ACCEPTANCE

    def finding(self) -> Finding:
        counts = f"{self.accepted} of {self.drafted} drafted tokens accepted ({100 * self.acceptance:.0f} %)"
        if self.rarely_accepted:
            return Finding("warning", f"live probe: {counts}. This sidecar fits this model's shapes but its drafts "
                                      "are almost never accepted: it was probably made for another finetune of the "
                                      "same base model. MTP with it only costs time; get the sidecar exported from "
                                      "this exact model.")
        if self.drafted < MIN_DRAFTED:
            return Finding("warning", f"live probe: only {self.drafted} tokens drafted ({counts}); too few to judge "
                                      "the sidecar. The model stopped early; try it in the chat.")
        return Finding("ok", f"live probe: {counts} over {self.rounds} rounds.")


def probe(target: str | Path, sidecar: str | Path | None, *, min_drafted: int = MIN_DRAFTED,
          prompts: tuple[str, ...] = PROMPTS, timeout: float = 600) -> ProbeResult:
    """Draft with ``target`` + ``sidecar`` (None: the target's own MTP head) in a child process.

    Raises:
        ProbeError: the engine could not load or run the pair (llama.cpp's words), or it timed out.
    """
    args = [sys.executable, "-c", _CHILD, str(target), str(sidecar or ""), str(min_drafted), json.dumps(prompts)]
    try:
        proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise ProbeError(f"the live probe did not finish in {timeout:.0f} s; the model may be too large for this "
                         "machine. Try it in the chat instead.", timed_out=True) from None
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("PROBE ")), None)
    if proc.returncode != 0 or line is None:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise ProbeError(f"the live probe could not run the pair (exit {proc.returncode}): {tail}")
    return ProbeResult(**json.loads(line.removeprefix("PROBE ")))
