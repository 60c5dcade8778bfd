"""Which prompts wait for follow-ups (engine/worker/together.py FollowUps)."""

from __future__ import annotations

from engine.generation.parallel import Job
from engine.generation.request import GenerateRequest, GenerateResult
from engine.speculative.stats import GenerationStats
from engine.worker import together
from engine.worker.together import FollowUps


def ended(*finishes: str | None) -> list[Job]:
    """Jobs that ended: with a result that finished so, or (None) with an error."""
    jobs = []
    for finish in finishes:
        job = Job(GenerateRequest(prompt="x"))
        if finish is None:
            job.error = RuntimeError("failed")
        else:
            job.result = GenerateResult(text="", tokens=[], finish_reason=finish, stats=GenerationStats())
        jobs.append(job)
    return jobs


def test_a_prompt_waits_only_for_as_many_requests_as_replies_ended_and_only_soon_after(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(together.time, "monotonic", lambda: now[0])
    f = FollowUps()
    f.arrive()
    assert not f.expected()  # nothing ended: a first request never waits
    f.read()
    f.end(ended("length"))
    f.arrive()
    assert not f.expected()  # a lone client: its reply ended, its next request came
    f.read()
    f.end(ended("length", "stop", "length"))
    f.end(ended("stop"))  # a step later, one more
    f.arrive()
    assert f.expected()
    f.arrive()
    f.arrive()
    assert f.expected()
    f.arrive()
    assert not f.expected()  # all four came
    f.read()
    f.end(ended("length", "length"))
    f.arrive()
    now[0] += together.EXPECT_S + 0.1
    assert not f.expected()  # replies that ended long ago: their clients do not send back to back
    f.read()
    assert not f.expected()


def test_replies_cancelled_or_failed_are_not_waited_for():
    f = FollowUps()
    f.end(ended("cancelled", None, "cancelled"))
    f.arrive()
    assert not f.expected()  # their clients went away or saw an error: the next prompt is read at once
    f.read()
    f.end(ended("length", "cancelled"))
    assert f.expected()  # (one finished a turn: its follow-up is waited for)
