"""The sidecar doctor: does this MTP sidecar fit this target, and if not, why,
in plain words — and can Repair fix it?

A vision projector (``mmproj-*.gguf``) is checked against its target by
``diagnose_projector`` (``engine.store.projectors``): width and family.

The rules are the load-time check's own (``engine.gguf.sidecar.assess``): what the
doctor calls fitting loads, and what it refuses the engine refuses too.
Everything is read from the two files' headers; nothing is loaded, unless a
live probe (``engine.store.probe``, in a child process) is asked for.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from engine.gguf.facts import GGUFFacts, read_facts
from engine.gguf.sidecar import Finding, RepairPlan, assess
from engine.store.probe import ProbeError, ProbeResult, probe
from engine.store.projectors import ProjectorDiagnosis, diagnose_projector, is_projector_name

__all__ = ["Diagnosis", "Finding", "ProjectorDiagnosis", "diagnose", "diagnose_facts", "diagnose_projector",
           "is_projector_name", "run_probe"]


@dataclass
class Diagnosis:
    target: GGUFFacts
    sidecar: GGUFFacts
    findings: list[Finding] = field(default_factory=list)
    plan: RepairPlan = field(default_factory=RepairPlan)  # what Repair would change
    probe: ProbeResult | None = None  # the live probe's counts, when one ran

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "warning"]

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def repairable(self) -> bool:
        """Every error is fixable, or (no errors) a warning is: a file this engine loads but
        other llama.cpp builds refuse (qwen4exp's duplicate head mixer)."""
        if self.errors:
            return all(f.fixable for f in self.errors)
        return any(f.fixable for f in self.warnings)

    def verdict(self) -> str:
        side, tgt = self.sidecar.path.name, self.target.path.name
        if self.ok and self.probe is not None and self.probe.rarely_accepted:
            return f"{side} loads with {tgt}, but its drafts are almost never accepted: get another sidecar."
        if self.ok:
            return f"{side} fits {tgt}" + (", with warnings." if self.warnings else ".")
        if self.repairable:
            return f"{side} does not load as it is, but Repair can fix it (it writes a corrected copy)."
        return f"{side} cannot be used with {tgt}; get the matching sidecar."

    def report(self) -> str:
        mark = {"ok": "ok  ", "warning": "warn", "error": "FAIL"}
        lines = [self.verdict(), ""]
        lines += [f"  [{mark[f.severity]}] {f.text}" + ("  (Repair fixes this)" if f.fixable and f.severity == "error"
                                                        else "") for f in self.findings]
        if self.ok and self.repairable:
            lines.append("  Repair writes a copy without the warned-about tensors.")
        return "\n".join(lines)


def diagnose(target_path: str | Path, sidecar_path: str | Path) -> Diagnosis:
    return diagnose_facts(read_facts(target_path), read_facts(sidecar_path))


def diagnose_facts(target: GGUFFacts, sidecar: GGUFFacts) -> Diagnosis:
    """The diagnosis from headers already read (the model library judges every pair on disk)."""
    a = assess(target, sidecar)
    return Diagnosis(target, sidecar, a.findings, a.plan)


def run_probe(d: Diagnosis, timeout: float = 600) -> Diagnosis:
    """``d`` plus the live probe's finding (drafts with the real pair, in a child process);
    ``d`` itself is left as it is, so a caller may show it while the probe runs.

    Only a pair that fits on paper is probed: anything else would be refused at load anyway.
    """
    d = replace(d, findings=list(d.findings))
    if not d.ok:
        d.findings.append(Finding("warning", "live probe skipped: the pair does not load as it is."))
        return d
    try:
        d.probe = probe(d.target.path, d.sidecar.path, timeout=timeout)
    except ProbeError as exc:
        d.findings.append(Finding("warning" if exc.timed_out else "error", str(exc)))
        return d
    d.findings.append(d.probe.finding())
    return d
