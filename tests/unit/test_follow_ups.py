"""Which prompts wait for follow-ups (engine/worker/together.py FollowUps)."""

from __future__ import annotations

from engine.worker import together
from engine.worker.together import FollowUps


def test_a_prompt_waits_only_for_as_many_requests_as_replies_ended_and_only_soon_after(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(together.time, "monotonic", lambda: now[0])
    f = FollowUps()
    f.arrive()
    assert not f.expected()  # nothing ended: a first request never waits
    f.read()
    f.end(1)
    f.arrive()
    assert not f.expected()  # a lone client: its reply ended, its next request came
    f.read()
    f.end(3)
    f.end(1)  # a step later, one more
    f.arrive()
    assert f.expected()
    f.arrive()
    f.arrive()
    assert f.expected()
    f.arrive()
    assert not f.expected()  # all four came
    f.read()
    f.end(2)
    f.arrive()
    now[0] += together.EXPECT_S + 0.1
    assert not f.expected()  # replies that ended long ago: their clients do not send back to back
    f.read()
    assert not f.expected()
