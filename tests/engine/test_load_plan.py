"""A load reads each GGUF header, and checks the sidecar against the target,
once: the worker makes the plan before it lets go of the loaded model, and the
session loads from that same plan."""

from __future__ import annotations

import pytest

import engine.gguf.facts
from engine.errors import SidecarMismatch
from engine.generation.load_plan import LoadPlan
from engine.generation.session import LoadOptions, Session
from tests.engine.conftest import synth


def test_a_session_loaded_from_the_workers_plan_reads_no_header_again(monkeypatch):
    model = synth("glm4moe")
    trunk, side = str(model.path("trunk")), str(model.path("sidecar"))
    reads: list[str] = []
    read = engine.gguf.facts.read_facts
    monkeypatch.setattr(engine.gguf.facts, "read_facts", lambda path: reads.append(str(path)) or read(path))
    plan = LoadPlan.read(LoadOptions(path=trunk, sidecar=side, n_ctx=256))
    assert reads == [trunk, side] and plan.want_mtp and not plan.mtp_in_target
    with Session(plan.options, plan) as session:
        assert session.mtp_drafter is not None and session.facts is plan.facts
    assert reads == [trunk, side]  # once per load


def test_the_plan_names_the_default_model_and_says_why_mtp_is_off():
    plan = LoadPlan.read(LoadOptions(n_ctx=256))
    assert plan.options.path is not None and plan.path.endswith(".gguf")
    assert not plan.want_mtp and plan.mtp_unavailable_reason  # the built-in model has no MTP head


def test_a_sidecar_made_for_another_model_is_refused_before_anything_loads():
    model = synth("glm4moe")
    with pytest.raises(SidecarMismatch):
        LoadPlan.read(LoadOptions(path=str(model.path("trunk")), sidecar=str(model.path("sidecar-other-vocab"))))
