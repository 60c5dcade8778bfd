"""``mtp-studio bench --drafters``: plain vs MTP vs n-gram vs MTP + n-gram,
on echo-heavy prompts and a generative one, measured side by side.

- **generative**: the base prompt, with an empty n-gram map
  (``NgramDrafter.forget``): a first reply, new text.
- **echo** (text models): the base prompt, the model's own greedy reply to
  it, then the base prompt again: the reply repeats text already in the
  context, as a code edit or a quoting summary does. (Synthetic models'
  tokenizers spell a prompt in byte tokens while the model writes word
  tokens, so a quoted reply never matches there: they skip this one.)
- **regenerate**: the base prompt again after a reply to it, the persistent
  n-gram map kept (primed by one unmeasured run of the same setting): the
  "regenerate" button, or an edited message.

Within a repeat every setting runs right after plain on the same prompt; the
ratio is taken within the repeat and the median over repeats is reported,
with the identity verdict against plain's greedy output.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.generation import identity
from engine.generation.generator import GenerateRequest, GenerateResult, generate
from engine.generation.session import Session
from engine.speculative.settings import SPECULATION_OFF, SpeculativeSettings, mtp, ngram

Say = Callable[[str], None]
MTP_N_MAX = 3  # MTP's depth here (and in the composition)
NGRAM_N_MAX = 8  # n-gram alone: a copied run is long when it is right
TEXT_PROMPT = "The history of the printing press"  # the base prompt for a real (text) model


@dataclass
class Row:
    prompt: str
    label: str
    tps: list[float] = field(default_factory=list)
    ratio: list[float] = field(default_factory=list)
    verdict: str = ""  # the worst identity verdict over the repeats (engine/generation/identity.py)
    accepted: int = 0
    drafted: int = 0
    sources: dict[str, list[int]] = field(default_factory=dict)  # source -> [accepted, drafted]


def settings_for(session: Session, n_max_mtp: int, n_max_ngram: int) -> list[tuple[str, SpeculativeSettings]]:
    """The settings compared: MTP and the composition only where the model has a head."""
    rows = [("plain", SPECULATION_OFF)]
    if session.mtp_drafter is not None:
        rows.append((f"mtp n_max={n_max_mtp}", mtp(n_max_mtp)))
    rows.append((f"ngram n_max={n_max_ngram}", ngram(n_max_ngram)))
    if session.mtp_drafter is not None:
        rows.append((f"mtp+ngram n_max={n_max_mtp}", ngram(n_max_mtp, mtp_too=True)))
    return rows


def _run(session: Session, prompt: str, n_tokens: int, spec: SpeculativeSettings,
         regenerate: bool = False) -> GenerateResult:
    if session.ngram_drafter is not None:
        session.ngram_drafter.forget()
    if regenerate and spec.uses_ngram:
        generate(session, GenerateRequest(prompt=prompt, max_tokens=n_tokens, speculative=spec))
    return generate(session, GenerateRequest(prompt=prompt, max_tokens=n_tokens, speculative=spec,
                                             record_margins=not spec.enabled))


def prompts_for(session: Session, base: str, n_tokens: int, echo: bool) -> list[tuple[str, str]]:
    prompts = [("generative", base), ("regenerate", base)]
    if echo:
        reply = _run(session, base, n_tokens, SPECULATION_OFF).text
        prompts.insert(0, ("echo", f"{base}{reply}\n\n{base}"))
    return prompts


def compare(session: Session, base: str, n_tokens: int, repeats: int, n_max_mtp: int, n_max_ngram: int,
            say: Say, echo: bool = True) -> list[Row]:
    settings = settings_for(session, n_max_mtp, n_max_ngram)
    prompts = prompts_for(session, base, n_tokens, echo)
    rows = {(p, label): Row(p, label) for p, _ in prompts for label, _ in settings}
    noise = identity.measure_noise(session)
    rank = {identity.IDENTICAL: 0, identity.NEAR_TIE: 1, identity.DEFECT: 2}
    for _ in range(repeats):
        for name, text in prompts:
            plain: GenerateResult | None = None
            for label, spec in settings:
                result = _run(session, text, n_tokens, spec, regenerate=name == "regenerate")
                row = rows[(name, label)]
                tps = result.stats.decode_tps() or 0.0
                row.tps.append(tps)
                if plain is None:
                    plain = result
                else:
                    base_tps = plain.stats.decode_tps() or 0.0
                    row.ratio.append(tps / base_tps if base_tps else 0.0)
                    kind = identity.classify(plain.tokens, plain.margins, result.tokens, noise).kind
                    row.verdict = max(row.verdict or kind, kind, key=rank.__getitem__)
                s = result.stats
                row.accepted, row.drafted = s.accepted, s.drafted
                row.sources = {src: [s.accepted_by_source.get(src, 0), d] for src, d in s.drafted_by_source.items()}
    out = list(rows.values())
    say(format_table(out))
    return out


def format_table(rows: list[Row]) -> str:
    lines = [f"{'prompt':<11} {'setting':<20} {'tok/s':>7} {'vs plain':>8} {'accepted':>9}  {'by source':<28} "
             "greedy output"]
    for r in rows:
        ratio = f"{statistics.median(r.ratio):7.2f}x" if r.ratio else f"{'1.00x':>8}"
        sources = " ".join(f"{src} {a}/{d}" for src, (a, d) in sorted(r.sources.items())) or "-"
        accepted = f"{r.accepted}/{r.drafted}" if r.drafted else "-"
        same = {identity.IDENTICAL: "= plain", identity.NEAR_TIE: "= plain up to a near tie",
                identity.DEFECT: "DIFFERS from plain"}.get(r.verdict, "")
        lines.append(f"{r.prompt:<11} {r.label:<20} {statistics.median(r.tps):7.1f} {ratio:>8} {accepted:>9}  "
                     f"{sources:<28} {same}")
    return "\n".join(lines)
