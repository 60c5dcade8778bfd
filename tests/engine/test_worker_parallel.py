"""The real worker serving several generate requests at once (engine/worker/together.py)."""

from __future__ import annotations

from engine.generation.generator import GenerateRequest, generate
from engine.generation.session import LoadOptions, Session
from engine.speculative.settings import mtp
from engine.worker import protocol as P
from engine.worker.client import WorkerClient
from tests.engine.conftest import synth

PROMPTS = [" the river model", " a quiet light", " numbers and words"]


def load(worker: WorkerClient, path: str, parallel: int) -> None:
    events = worker.call(P.LoadRequest(id=worker.new_id(), options=P.LoadOptions(path=path, n_ctx=512,
                                                                                parallel=parallel)))
    assert isinstance(events[-1], P.LoadedEvent), events


def collect(worker: WorkerClient, ids: set[str], timeout: float = 120) -> list[P.Event]:
    """Every event until each of ``ids`` is done (and whatever else came meanwhile)."""
    events, open_ids = [], set(ids)
    while open_ids:
        event = worker.next_event(timeout)
        events.append(event)
        if isinstance(event, P.DoneEvent):
            open_ids.discard(event.id)
    return events


def text(events: list[P.Event], rid: str) -> str:
    return "".join(e.text for e in events if isinstance(e, P.TokenEvent) and e.id == rid)


def alone(path: str, n_seq: int, max_tokens: int) -> list[str]:
    with Session(LoadOptions(path=path, n_ctx=512 * n_seq)) as session:
        return [generate(session, GenerateRequest(prompt=p, max_tokens=max_tokens, speculative=mtp(3))).text
                for p in PROMPTS]


def test_requests_sent_together_are_decoded_together_each_as_alone(worker: WorkerClient):
    path = str(synth("glm4moe", "mixed", agree=0.7, reads="hidden").path())
    load(worker, path, parallel=3)
    for i, prompt in enumerate(PROMPTS):
        worker.send(P.GenerateRequestMsg(id=f"g{i}", prompt=prompt, max_tokens=40, speculative=mtp(3)))
    worker.send(P.TokenizeRequest(id="t", text="hello"))  # answered while they run
    events = collect(worker, {"g0", "g1", "g2"})
    assert [text(events, f"g{i}") for i in range(3)] == alone(path, 3, 40)
    done = {e.id: e for e in events if isinstance(e, P.DoneEvent)}
    assert all(d.finish_reason == "length" and d.stats.rounds > 0 for d in done.values())
    # decoded together: the token events of the three requests interleave
    order = [e.id for e in events if isinstance(e, P.TokenEvent)]
    assert order.index("g2") < len(order) - order[::-1].index("g0") - 1
    tokens = next(e for e in events if isinstance(e, P.TokensEvent))
    assert tokens.id == "t" and events.index(tokens) < max(events.index(d) for d in done.values())


def test_a_cancelled_request_ends_alone_and_a_load_waits_for_the_running_ones(worker: WorkerClient):
    path = str(synth("glm4moe", "mixed", agree=0.7, reads="hidden").path())
    load(worker, path, parallel=2)
    worker.send(P.GenerateRequestMsg(id="a", prompt=PROMPTS[0], max_tokens=200, speculative=mtp(3)))
    worker.send(P.GenerateRequestMsg(id="b", prompt=PROMPTS[1], max_tokens=60, speculative=mtp(3)))
    first = worker.next_event(60)
    while not (isinstance(first, P.TokenEvent) and first.id == "a"):
        first = worker.next_event(60)
    worker.send(P.CancelRequest(id="c", target="a"))
    worker.send(P.LoadRequest(id="l", options=P.LoadOptions(path=path, n_ctx=512, parallel=1)))
    worker.send(P.GenerateRequestMsg(id="after", prompt=PROMPTS[2], max_tokens=8))
    events = collect(worker, {"a", "b", "after"})
    done = {e.id: e for e in events if isinstance(e, P.DoneEvent)}
    assert done["a"].finish_reason == "cancelled" and done["b"].finish_reason == "length"
    assert text(events, "b") == alone(path, 2, 60)[1]  # untouched by its neighbour's cancel
    loaded = next(i for i, e in enumerate(events) if isinstance(e, P.LoadedEvent))
    assert loaded > max(events.index(done["a"]), events.index(done["b"]))  # the load waited for both
    assert done["after"].finish_reason == "length"  # served after the load, alone


def test_a_request_with_an_image_joins_the_running_ones(worker: WorkerClient, synth_models):
    """Sent while a text reply runs, it starts at once (its prompt decoded into its own sequence) and the two
    interleave; each is what it gives alone."""
    import base64

    from tests.engine.test_parallel_images import QUADRANTS, files

    path, mmproj = files(synth_models, "qwen35")
    events = worker.call(P.LoadRequest(id=worker.new_id(), options=P.LoadOptions(path=path, n_ctx=1024, parallel=2,
                                                                                 mmproj=mmproj)))
    assert isinstance(events[-1], P.LoadedEvent) and events[-1].model.vision, events
    pictured = f"Look at this: {P.IMAGE_MARKER} It shows"
    with Session(LoadOptions(path=path, n_ctx=2048, mmproj=mmproj)) as session:
        want_text = generate(session, GenerateRequest(prompt=PROMPTS[0], max_tokens=60, speculative=mtp(3))).text
        want_image = generate(session, GenerateRequest(prompt=pictured, images=(QUADRANTS,), max_tokens=24,
                                                       speculative=mtp(3))).text
    worker.send(P.GenerateRequestMsg(id="t", prompt=PROMPTS[0], max_tokens=60, speculative=mtp(3)))
    first = worker.next_event(60)
    while not (isinstance(first, P.TokenEvent) and first.id == "t"):
        first = worker.next_event(60)
    worker.send(P.GenerateRequestMsg(id="i", prompt=pictured, images=[base64.b64encode(QUADRANTS).decode()],
                                     max_tokens=24, speculative=mtp(3)))
    events = [first, *collect(worker, {"t", "i"})]
    done = {e.id: e for e in events if isinstance(e, P.DoneEvent)}
    assert text(events, "t") == want_text and text(events, "i") == want_image
    assert done["i"].stats.drafted > 0
    order = [e.id for e in events if isinstance(e, P.TokenEvent)]
    assert order.index("i") < len(order) - order[::-1].index("t") - 1  # the image reply came while "t" ran


def test_follow_ups_to_replies_that_ended_together_are_read_in_one_decode(worker: WorkerClient):
    """Clients sending back to back answer replies that ended in one step with requests a moment apart:
    the first waits for the other (FollowUps), and both prompts are read in one decode. Started at once,
    the first was read alone and ended a step before the other, for good. Two-token replies: read together,
    both end in the same step (their done events together); read apart, the second's last token comes
    between them."""
    path = str(synth("glm4moe", "mixed", agree=0.7, reads="hidden").path())
    load(worker, path, parallel=2)
    for rid, prompt in (("p0", PROMPTS[0]), ("p1", PROMPTS[1])):
        worker.send(P.GenerateRequestMsg(id=rid, prompt=prompt, max_tokens=2))
    collect(worker, {"p0", "p1"})
    for rid, prompt in (("a", PROMPTS[2]), ("b", PROMPTS[0] + " again")):
        worker.send(P.GenerateRequestMsg(id=rid, prompt=prompt, max_tokens=2))
    events = collect(worker, {"a", "b"})
    done = sorted(i for i, e in enumerate(events) if isinstance(e, P.DoneEvent))
    between = [e for e in events[done[0]:done[1]] if isinstance(e, P.TokenEvent)]
    assert between == [], "the two prompts were read in different decodes"
    assert [text(events, "a"), text(events, "b")] == [
        generate_alone(path, PROMPTS[2]), generate_alone(path, PROMPTS[0] + " again")]


def generate_alone(path: str, prompt: str) -> str:
    with Session(LoadOptions(path=path, n_ctx=512)) as session:
        return generate(session, GenerateRequest(prompt=prompt, max_tokens=2)).text
